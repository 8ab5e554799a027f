# Song et al. (2019): WMT14 En-De, big (Tables 2c and 3). As the base setting
# (song2019_wmt14_base.sh, read first) except for what follows. Labels: [paper], [*]
# (docs/reproduce.md).
. "$(dirname "${BASH_SOURCE[0]}")/song2019_wmt14_base.sh"
# [*] the setting's name in our tables.
DESCRIPTION="Song et al. 2019, WMT14 En-De, big"

# [paper] "1024 dimensions for the big model"; 16 heads. [*] FFN 4096: fairseq's vaswani
# big preset.
ARCH=hysan_transformer_vaswani_wmt_en_de_big

# [paper] eq. 15 at d = 1024. [*] with 4000 warm-up steps (not stated): 1024^-0.5 *
# 4000^-0.5 = 5e-4; dropout is not given: Vaswani et al.'s big En-De model, 0.3. 20
# checkpoints kept for the average.
song2019_recipe 5e-4 0.3 0.0 20
# [paper] "... 300K steps for big model"; "averaging the last 5 and 20 checkpoints for
# the base and big model respectively".
MAX_UPDATE=300000
AVERAGE_LAST=20
