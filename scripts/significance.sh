#!/usr/bin/env bash
# Paired bootstrap significance of BLEU between systems (compare-mt, Koehn 2004).
#
# Usage: significance.sh --ref FILE --baseline NAME=HYP --system NAME=HYP [--system NAME=HYP ...] \
#                        --out DIR [--samples 1000] [--seed 1] [--prob-thresh 0.05] \
#                        [--tokenize 13a|none] [--force]
#
# compare-mt draws N samples of half the sentences (with replacement), scores every
# system on each, and counts which system wins. Outputs in DIR (built in a temporary
# directory, renamed at the end):
#   significance.json   each system's BLEU and bootstrap interval; per pair the win /
#                       tie / loss rates of the system against the baseline, compare-mt's
#                       p (1 - the larger win rate) and verdict (which system is better
#                       at --prob-thresh, or none)
#   compare_mt.txt      compare-mt's text report (all its default analyses)
#   index.html          compare-mt's HTML report, with its figures next to it
#   inputs/             the (tokenized) texts compare-mt read
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_options "$@" <<'EOF'
--ref FILE           REF       file             required
    reference, one sentence per line (raw, like evaluate.sh's --ref)
--baseline NAME=HYP  BASELINE  text             required
    the baseline's hypotheses (e.g. evaluate.sh's hyp.detok);
    NAME: letters, digits and _.+- ; HYP: a file with one line
    per reference line
--system NAME=HYP    SYSTEMS   list             required
    a system to compare with the baseline (repeatable; compare-mt
    then compares every pair)
--out DIR            OUT       text             required
    directory for the reports (see below); an earlier result of
    this script there (DIR/significance.json) is replaced, any other
    existing DIR only with --force
--samples N          SAMPLES   int:1            1000
    bootstrap samples (default 1000, as in the papers)
--seed N             SEED      int:0            1
    seed of compare-mt's sampling (default 1: reruns give the same numbers)
--prob-thresh P      PROB      float            0.05
    significance level of compare-mt's verdict (default 0.05)
--tokenize T         TOKENIZE  choice:13a|none  13a
    13a (default): tokenize all texts with sacrebleu's default
    tokenizer first, so compare-mt's BLEU equals sacrebleu's;
    none: the files are tokenized already (e.g. evaluate.sh's
    hyp.tok_bleu / ref.tok_bleu for tokenized BLEU)
--force              FORCE     flag             -
    replace an existing --out directory whatever it holds
EOF

# ---- validate
n_ref=$(count_lines "$REF")
(( n_ref > 0 )) || die "--ref: '$REF' is empty; expected one reference sentence per line"
HYP_ARGS=()
NAMES=" "
check_named() {  # OPTION NAME=HYP
    local opt="$1" spec="$2" name path n
    [[ "$spec" == *=* ]] || die "$opt: expected NAME=HYP (a system name, '=', a hypothesis file), got '$spec'"
    name="${spec%%=*}" path="${spec#*=}"
    [[ "$name" =~ ^[A-Za-z0-9_.+-]+$ ]] \
        || die "$opt: expected NAME=HYP with a NAME of letters, digits and _.+- ; got name '$name' in '$spec'"
    [[ -n "$path" ]] || die "$opt: expected NAME=HYP, the file after '=' is missing in '$spec'"
    [[ "$NAMES" != *" $name "* ]] || die "$opt: the name '$name' is used twice; expected distinct system names"
    require_file "$path" "$opt $name"
    n=$(count_lines "$path")
    (( n == n_ref )) || die "$opt $name: '$path' has $n lines but --ref '$REF' has $n_ref; expected one \
hypothesis per reference line"
    NAMES+="$name "
    HYP_ARGS+=(--hyp "$name=$path")
}
check_named --baseline "$BASELINE"
for spec in "${SYSTEMS[@]}"; do
    check_named --system "$spec"
done
[[ ! -e "$OUT" || -d "$OUT" ]] || die "--out: '$OUT' exists and is not a directory"
if [[ -d "$OUT" && $FORCE -eq 0 && ! -f "$OUT/significance.json" && -n "$(ls -A "$OUT")" ]]; then
    die "--out: '$OUT' already exists and is not the output of an earlier significance.sh run; expected a \
new directory (or pass --force to replace it)"
fi

# ---- work
mkdir -p "$(dirname "$OUT")"
TMP="$(mktemp -d "${OUT%/}.tmp.XXXXXX")"
chmod 755 "$TMP"
trap 'rm -rf "$TMP"' EXIT

run env MPLBACKEND=Agg "$PY" "$SCRIPTS_DIR/compare_mt_bootstrap.py" --ref "$REF" "${HYP_ARGS[@]}" \
    --samples "$SAMPLES" --seed "$SEED" --prob-thresh "$PROB" --tokenize "$TOKENIZE" --out "$TMP"

rm -rf "$OUT"
mv "$TMP" "$OUT"
trap - EXIT
echo "${PROG}: wrote $OUT (significance.json, compare_mt.txt, index.html)" >&2
