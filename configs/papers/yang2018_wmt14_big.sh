# Yang et al. (2018): WMT14 En-De, Transformer-Big (Table 4). As the base setting
# (yang2018_wmt14_base.sh, read first) except for what follows. Labels: [paper], [*]
# (docs/reproduce.md).
. "$(dirname "${BASH_SOURCE[0]}")/yang2018_wmt14_base.sh"
# [*] the setting's name in our tables.
DESCRIPTION="Yang et al. 2018, WMT14 En-De, Transformer-Big"

# [paper] "the Base and Big models, which differ at the layer size (512 vs. 1024) and
# the number of attention heads (8 vs. 16)". [*] FFN 4096: fairseq's vaswani big preset.
ARCH=localness_transformer_vaswani_wmt_en_de_big

# [*] Vaswani et al.'s big En-De model (the paper follows their configuration): dropout
# 0.3; the lr formula at d = 1024: 1024^-0.5 * 4000^-0.5 = 5e-4; 20 checkpoints kept.
vaswani_recipe 5e-4 0.3 0.0 20
# [*] not stated; Vaswani et al.'s big model: 300K steps.
MAX_UPDATE=300000
# [*] not stated; Vaswani et al.: the last 20 checkpoints of a big model.
AVERAGE_LAST=20
