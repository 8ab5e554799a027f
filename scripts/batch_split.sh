# How a paper's batch (tokens per update, all processes together) is split into
# fairseq's per-process --max-tokens and --update-freq for a given number of
# processes. Source it, do not run it; used by train.sh (--effective-tokens) and by
# the reproduce drivers (scripts/reproduce/common.sh), so both print the same numbers.
#
# batch_split T W CAP [LONGEST]
#   T        the paper's batch in tokens per update
#   W        processes (GPUs, or CPU processes) that train together
#   CAP      the most tokens one process may hold in one batch (the --max-tokens of
#            the configuration or the command line: the memory limit)
#   LONGEST  the longest training pair in tokens (0: unknown); fairseq stops on a pair
#            longer than --max-tokens, so a split below it is refused
# sets
#   BATCH_MAX_TOKENS   per-process --max-tokens  m = floor(T / (W x u))
#   BATCH_UPDATE_FREQ  --update-freq             u = ceil(T / (CAP x W)), the smallest
#                      with m <= CAP
#   BATCH_TOKENS       m x W x u: at most T, and less than T by under W x u tokens
#                      (under one token per process and accumulated batch)
#   BATCH_TEXT         the arithmetic, one line
#   BATCH_ERROR        why no split is possible (empty when there is one); the
#                      function then returns 1
set -euo pipefail
batch_split() {
    local t="$1" w="$2" cap="$3" longest="${4:-0}"
    BATCH_MAX_TOKENS="" BATCH_UPDATE_FREQ="" BATCH_TOKENS="" BATCH_TEXT="" BATCH_ERROR=""
    if (( w > t )); then
        BATCH_ERROR="a batch of $t tokens per update cannot be split over $w processes (fewer than one token \
each); expected at most $t processes"
        return 1
    fi
    local u=$(( (t + cap * w - 1) / (cap * w) ))
    local m=$(( t / (w * u) ))
    local e=$(( m * w * u ))
    BATCH_MAX_TOKENS="$m" BATCH_UPDATE_FREQ="$u" BATCH_TOKENS="$e"
    local bp=$(( (e - t) * 10000 / t )) sign=+  # the difference in hundredths of a percent
    (( e < t )) && sign=- bp=$(( -bp ))
    local pct
    printf -v pct '%s%d.%02d%%' "$sign" $(( bp / 100 )) $(( bp % 100 ))
    BATCH_TEXT="$t tokens per update over $w process(es): --update-freq $u = ceil($t / ($cap max tokens x $w)), \
--max-tokens $m = floor($t / ($w x $u)); $m x $w x $u = $e tokens per update ($pct of $t)"
    if (( longest > 0 && m < longest )); then
        if (( cap < longest )); then
            BATCH_ERROR="--max-tokens $cap is smaller than the longest training pair ($longest tokens), which \
fairseq must fit in one batch; expected --max-tokens >= $longest"
        else
            BATCH_ERROR="$t tokens per update over $w processes leaves $m tokens per process (floor($t / ($w x $u))), \
but the longest training pair has $longest tokens and fairseq must fit it in one batch; expected at most \
$(( t / longest )) processes for this batch"
        fi
        return 1
    fi
    # m x W x u is within W x u tokens of T: more than 5% only when a process holds a few
    # dozen tokens, which no real training pair fits in
    if (( (t - e) * 20 > t )); then
        BATCH_ERROR="$BATCH_TEXT: more than 5% below the batch of $t tokens; expected fewer processes"
        return 1
    fi
    return 0
}
