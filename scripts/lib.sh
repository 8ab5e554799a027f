# Shared helpers for the pipeline scripts. Source it, do not run it:
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Conventions of every script in scripts/:
#   - `set -euo pipefail`: the first failing command stops the script;
#   - every command that does work is run through `run`, which prints it first
#     (as "+ cmd ...", on stderr, quoted so it can be copied and rerun): the
#     commands a user would run (fairseq-*, the subword and scoring tools, the
#     pipeline scripts), not the scripts' own bookkeeping (moving, copying and
#     removing their temporary files), which runs unprinted;
#   - all arguments and inputs are checked before the first command runs, and a
#     bad one stops the script with exit status 2 and a message saying what was
#     expected (die / require_*), so nothing is written for a command that cannot
#     succeed.
set -euo pipefail

SCRIPTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"  # a linked scripts/ finds its repository
REPO_DIR="$(dirname "$SCRIPTS_DIR")"
PROG="$(basename "$0")"

# Print a command, then run it.
run() {
    local quoted
    printf -v quoted ' %q' "$@"
    echo "+${quoted}" >&2
    "$@"
}

# Stop with a message (exit status 2: a usage or input error, nothing was done).
die() {
    echo "${PROG}: error: $*" >&2
    exit 2
}

# require_file FILE WHAT: FILE must exist (WHAT says which option/input it is).
require_file() {
    [[ -f "$1" ]] || die "$2: expected a file at '$1', which does not exist"
}

# require_dir DIR WHAT
require_dir() {
    [[ -d "$1" ]] || die "$2: expected a directory at '$1', which does not exist"
}

# require_value OPTION VALUE: the option was given (non-empty).
require_value() {
    [[ -n "$2" ]] || die "missing required option $1 (see '${PROG} --help')"
}

# require_int OPTION VALUE [MIN]: a whole number >= MIN (default 1).
require_int() {
    local min="${3:-1}"
    [[ "$2" =~ ^[0-9]+$ ]] && (( 10#$2 >= min )) \
        || die "$1: expected a whole number >= ${min}, got '$2'"
}

# parse_seeds OPTION VALUE: SEEDS, the training seeds VALUE names: a number of seeds N
# (seeds 1..N; e.g. 3: seeds 1,2,3) or a comma-separated list of two or more distinct
# seeds (whole numbers, e.g. 1,5,7). Anything else (empty, 0, a negative or fractional
# number, a seed named twice) stops with exit status 2 and a message naming OPTION.
parse_seeds() {
    local name="$1" value="$2" k
    SEEDS=()
    if [[ "$value" =~ ^[0-9]+$ ]]; then
        (( 10#$value >= 1 )) || die "$name: expected a whole number >= 1, got '$value' (a number of seeds N, \
seeds 1..N, or a comma-separated list of distinct seeds, e.g. 1,5,7)"
        for (( k = 1; k <= 10#$value; k++ )); do SEEDS+=("$k"); done
    elif [[ "$value" =~ ^[0-9]+(,[0-9]+)+$ ]]; then
        IFS=, read -r -a SEEDS <<< "$value"
        for k in "${!SEEDS[@]}"; do SEEDS[$k]=$((10#${SEEDS[$k]})); done
        [[ "$(printf '%s\n' "${SEEDS[@]}" | sort -u | wc -l)" == "${#SEEDS[@]}" ]] \
            || die "$name: '$value' names a seed twice; expected distinct seeds (e.g. 1,5,7)"
    else
        die "$name: expected a number of seeds (e.g. 3: seeds 1,2,3) or a comma-separated list of seeds \
(whole numbers, e.g. 1,5,7), got '$value'"
    fi
}

# require_float OPTION VALUE
require_float() {
    [[ "$2" =~ ^-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]] \
        || die "$1: expected a number, got '$2'"
}

# require_choice OPTION VALUE CHOICE...
require_choice() {
    local opt="$1" val="$2"
    shift 2
    local c
    for c in "$@"; do
        [[ "$val" == "$c" ]] && return 0
    done
    die "$opt: expected one of: $*; got '$val'"
}

# require_lang OPTION CODE: a language code usable in fairseq file names.
require_lang() {
    [[ "$2" =~ ^[A-Za-z0-9_]+$ ]] \
        || die "$1: expected a language code (letters, digits, '_'), got '$2'"
}

# count_lines FILE: the number of lines of FILE: its \n-terminated lines plus an
# unterminated last one (a file without a final newline is not one line short).
count_lines() {
    local n
    n=$(wc -l < "$1")
    if [[ -s "$1" ]] && (( $(tail -c 1 "$1" | wc -l) == 0 )); then
        n=$((n + 1))
    fi
    echo $((n))
}

# check_stage STAGE EXPECTED FILE...: after a processing stage, each FILE has
# EXPECTED lines; a tool that split or merged lines stops the script here, before a
# misaligned file is used.
check_stage() {
    local stage="$1" expected="$2" f n
    shift 2
    for f in "$@"; do
        n=$(count_lines "$f")
        (( n == expected )) || die "$stage: wrote $n lines to '$f' for $expected input lines; \
the lines are no longer aligned, stopping (nothing was written to the output)"
    done
}


# The Python interpreter that has fairseq and fairseq_localness: $PYTHON if set,
# else the one next to fairseq-train on PATH, else the repository's .venv.
find_python() {
    if [[ -n "${PYTHON:-}" ]]; then
        echo "$PYTHON"
        return
    fi
    local ft
    if ft="$(command -v fairseq-train 2>/dev/null)" && [[ -x "$(dirname "$ft")/python" ]]; then
        echo "$(dirname "$ft")/python"
        return
    fi
    if [[ -x "$REPO_DIR/.venv/bin/python" ]]; then
        echo "$REPO_DIR/.venv/bin/python"
        return
    fi
    die "no Python with fairseq found: run 'make install' (it installs into .venv/) or set PYTHON"
}
PY="$(find_python)"
BIN_DIR="$(dirname "$PY")"
# The fairseq CLIs and helper tools installed next to that Python come first on PATH.
export PATH="$BIN_DIR:$PATH"

# The --user-dir for every fairseq command: the directory of the installed
# fairseq_localness package (found without importing it, which would load fairseq).
user_dir() {
    "$PY" -c 'import importlib.util as u, sys
spec = u.find_spec("fairseq_localness")
if spec is None:
    sys.exit("fairseq_localness is not installed for " + sys.executable + ": run make install")
print(list(spec.submodule_search_locations)[0])'
}

# train_check ARG...: fairseq-localness-train-check (fairseq_localness/cli/train_check.py,
# the checks before fairseq-train starts), installed next to the Python, or run as a
# module where an older install does not have the script yet. Imports fairseq.
train_check() {
    if [[ -x "$BIN_DIR/fairseq-localness-train-check" ]]; then
        "$BIN_DIR/fairseq-localness-train-check" "$@"
    else
        "$PY" -m fairseq_localness.cli.train_check "$@"
    fi
}

# check_arch ARCH: ARCH must be a registered architecture (fairseq's and this
# package's); else the script stops naming the expected ones.
check_arch() {
    local msg
    msg="$(train_check arch -- "$1" 2>/dev/null)" && return 0
    msg="${msg#*$'\n'}"  # (its first line names ARCH, the second the expected ones)
    die "--arch: '$1' is not a registered architecture. Expected one of the \
${msg:-registered architectures (importing fairseq_localness failed; run '$PY -c \"import fairseq_localness\"' to see why)}"
}

# check_train_args [--hardware] [--resume-from DIR] [--print-longest-pair] ARG...: the
# fairseq-train arguments ARG... (with --user-dir and --arch) parsed as fairseq-train
# parses them: a bad one stops the script with exit status 2 and one line naming the
# option, before fairseq-train creates --save-dir; then, in the same process, it prints
# (stdout) with --hardware a line 'hardware: N CC XLA' (CUDA devices, capability,
# torch_xla), with --resume-from a line 'resume: WHAT' (what a training in DIR resumes
# from) and with --print-longest-pair the longest training pair fairseq batches, in
# tokens (0 where the data cannot be read that way), last. See
# fairseq-localness-train-check --help.
check_train_args() {
    local opts=()
    while [[ "${1:-}" =~ ^--(hardware|print-longest-pair|resume-from)$ ]]; do
        if [[ "$1" == --resume-from ]]; then
            opts+=("--resume-from=$2")
            shift 2
        else
            opts+=("$1")
            shift
        fi
    done
    train_check args --prog="$PROG" "${opts[@]}" -- "$@" \
        2> >(grep -v "^INFO:\|Please install tensorboardX" >&2) || exit 2
}

# require_pair DATA_BIN SRC TGT SUBSET...: a fairseq-preprocess output directory
# with the dictionaries of both languages and the given subsets for SRC-TGT.
require_pair() {
    local bin="$1" src="$2" tgt="$3"
    shift 3
    require_dir "$bin" "--data-bin"
    local pairs
    pairs="$(cd "$bin" && ls 2>/dev/null | sed -n 's/^[a-z]*[0-9]*\.\([^.]*-[^.]*\)\.[^.]*\.idx$/\1/p' | sort -u | tr '\n' ' ')"
    local lang
    for lang in "$src" "$tgt"; do
        [[ -f "$bin/dict.$lang.txt" ]] || die "--data-bin '$bin' has no dictionary for language '$lang' \
(expected $bin/dict.$lang.txt; language pairs found there: ${pairs:-none}). Check --src/--tgt."
    done
    local subset
    for subset in "$@"; do
        [[ -f "$bin/$subset.$src-$tgt.$src.idx" && -f "$bin/$subset.$src-$tgt.$tgt.idx" ]] \
            || die "--data-bin '$bin' has no '$subset' data for $src-$tgt (expected \
$bin/$subset.$src-$tgt.{$src,$tgt}.{bin,idx}; language pairs found there: ${pairs:-none}). Check --src/--tgt."
    done
}

# ---- the scripts' options
# parse_options "$@" <<'EOF' TABLE EOF: the script's options, declared by TABLE, read
# from the arguments into their variables and checked. TABLE has one entry per option:
#     --option [METAVAR]  VAR  KIND  DEFAULT
#         its help, indented, on the lines below (what --help prints beside it)
# METAVAR names the value in --help (a flag has none). DEFAULT: VAR's value when the
# option is not given: a word, '-' (empty) or 'required' (the option must be given).
# An entry without help shares the next one's (--help prints them on one line). A line
# that is neither indented nor an option is a heading: --help prints the options below
# it as a group under it. KIND, and what a given value must be:
#     text          anything
#     int:MIN       a whole number >= MIN (require_int)
#     float         a number (require_float)
#     choice:A|B|C  one of A, B, C (require_choice)
#     lang          a language code (require_lang)
#     file, dir     an existing file, directory (require_file, require_dir)
#     flag          takes no value: VAR is 1 when given, else 0
#     list          repeatable: VAR is the array of the values given
#     pass          repeatable: VAR is the array of the options given and their values,
#                   in the order given (options handed on as they are)
#     rest:TOOL     the entry of '--': VAR is the array of the arguments after it, TOOL's
#                   (an unknown option's message says that TOOL's options go there)
# The checks, each stopping the script with exit status 2 and a message naming the
# option, in this order: the arguments as they come (an unknown option, an option
# without its value), the required options, the values given (their kinds, in table
# order), the files and directories given. -h and --help print the usage and exit.
parse_options() {
    local _line _text _i=-1 _k _v _var _kind _tool="" _check
    local -a _f _choices _given=()
    _OPT_NAMES=() _OPT_METAS=() _OPT_VARS=() _OPT_KINDS=() _OPT_HELPS=() _OPT_REQUIRED=()
    declare -gA _OPT_INDEX=()
    while IFS= read -r _line; do
        [[ "$_line" =~ [^[:space:]] ]] || continue
        _text="${_line#"${_line%%[![:space:]]*}"}"
        if [[ "$_line" == [[:space:]]* ]]; then  # help of the entry above
            (( _i >= 0 )) || die "option table: help '$_text' before the first option"
            _OPT_HELPS[_i]+="${_OPT_HELPS[_i]:+$'\n'}$_text"
            continue
        fi
        _i=$((_i + 1))
        _OPT_HELPS[_i]=""
        if [[ "$_line" != -* ]]; then  # a heading
            _OPT_NAMES[_i]="" _OPT_HELPS[_i]="$_line"
            continue
        fi
        read -r -a _f <<< "$_line"
        case ${#_f[@]} in
            4) _f=("${_f[0]}" "" "${_f[@]:1}") ;;
            5) ;;
            *) die "option table: expected '--option [METAVAR] VAR KIND DEFAULT', got '$_line'" ;;
        esac
        _var="${_f[2]}" _kind="${_f[3]}"
        [[ "$_var" =~ ^[A-Z_][A-Z0-9_]*$ ]] || die "option table: '$_var' is not a variable name (in '$_line')"
        _OPT_NAMES[_i]="${_f[0]}" _OPT_METAS[_i]="${_f[1]}" _OPT_VARS[_i]="$_var" _OPT_KINDS[_i]="$_kind"
        _OPT_REQUIRED[_i]=0
        _OPT_INDEX[${_f[0]}]=$_i
        case "$_kind" in
            flag) printf -v "$_var" 0 ;;
            list|pass|rest:*) eval "$_var=()" ;;
            text|int:*|float|choice:*|lang|file|dir)
                case "${_f[4]}" in
                    -) printf -v "$_var" '' ;;
                    required) printf -v "$_var" ''; _OPT_REQUIRED[_i]=1 ;;
                    *) printf -v "$_var" '%s' "${_f[4]}" ;;
                esac ;;
            *) die "option table: unknown kind '$_kind' (in '$_line')" ;;
        esac
        if [[ "$_kind" == list && "${_f[4]}" == required ]]; then
            _OPT_REQUIRED[_i]=1
        elif [[ "$_kind" == rest:* ]]; then
            _tool="${_kind#rest:}"
        fi
    done

    while (( $# )); do
        case "$1" in
            -h|--help) usage; exit 0 ;;
        esac
        _k="${_OPT_INDEX[$1]:-}"
        [[ -n "$_k" ]] || die "unknown option '$1' (see '${PROG} --help'${_tool:+; $_tool options go after --})"
        _var="${_OPT_VARS[_k]}"
        _given[_k]=1
        case "${_OPT_KINDS[_k]}" in
            flag) printf -v "$_var" 1; shift; continue ;;
            rest:*) shift; eval "$_var=(\"\$@\")"; break ;;
        esac
        (( $# >= 2 )) || die "option $1 needs a value"
        case "${_OPT_KINDS[_k]}" in
            list) eval "$_var+=(\"\$2\")" ;;
            pass) eval "$_var+=(\"\$1\" \"\$2\")" ;;
            *) printf -v "$_var" '%s' "$2" ;;
        esac
        shift 2
    done

    for _k in "${!_OPT_REQUIRED[@]}"; do
        (( _OPT_REQUIRED[_k] )) || continue
        if [[ "${_OPT_KINDS[_k]}" == list ]]; then
            eval "_v=\${#${_OPT_VARS[_k]}[@]}"
            (( _v )) || die "missing required option ${_OPT_NAMES[_k]} (see '${PROG} --help')"
        else
            require_value "${_OPT_NAMES[_k]}" "${!_OPT_VARS[_k]}"
        fi
    done
    for _check in values paths; do
        for _k in "${!_given[@]}"; do
            _kind="${_OPT_KINDS[_k]}"
            case "$_kind" in flag|list|pass|rest:*|text) continue ;; esac
            _v="${!_OPT_VARS[_k]}"
            case "$_check:$_kind" in
                values:int:*) require_int "${_OPT_NAMES[_k]}" "$_v" "${_kind#int:}" ;;
                values:float) require_float "${_OPT_NAMES[_k]}" "$_v" ;;
                values:choice:*)
                    IFS='|' read -r -a _choices <<< "${_kind#choice:}"
                    require_choice "${_OPT_NAMES[_k]}" "$_v" "${_choices[@]}" ;;
                values:lang) require_lang "${_OPT_NAMES[_k]}" "$_v" ;;
                paths:file) require_file "$_v" "${_OPT_NAMES[_k]}" ;;
                paths:dir) require_dir "$_v" "${_OPT_NAMES[_k]}" ;;
            esac
        done
    done
}

# The options of the table of parse_options as --help prints them: each with its
# METAVAR, its help beside it, the groups under their headings.
options_help() {
    local i j left width=0 pad first=1 line
    local -a lefts=()
    local joined=""
    for i in "${!_OPT_NAMES[@]}"; do  # the left column: option and METAVAR, shared help joined
        [[ -n "${_OPT_NAMES[i]}" ]] || continue
        left="${_OPT_NAMES[i]}${_OPT_METAS[i]:+ ${_OPT_METAS[i]}}"
        joined+="${joined:+, }$left"
        [[ -n "${_OPT_HELPS[i]}" ]] || continue
        lefts[i]="$joined"
        joined=""
        if (( ${#lefts[i]} <= 24 && ${#lefts[i]} > width )); then
            width=${#lefts[i]}
        fi
    done
    for i in "${!_OPT_NAMES[@]}"; do
        if [[ -z "${_OPT_NAMES[i]}" ]]; then  # a heading
            if (( ! first )); then
                echo
            fi
            echo "${_OPT_HELPS[i]}"
            first=0
            continue
        fi
        [[ -n "${_OPT_HELPS[i]}" ]] || continue
        first=0
        printf -v pad '%*s' $((width + 4)) ''
        j=0
        while IFS= read -r line; do
            if (( j == 0 )); then
                if (( ${#lefts[i]} > width )); then
                    echo "  ${lefts[i]}"
                    echo "$pad$line"
                else
                    printf '  %-*s  %s\n' "$width" "${lefts[i]}" "$line"
                fi
            else
                echo "$pad$line"
            fi
            j=$((j + 1))
        done <<< "${_OPT_HELPS[i]}"
    done
}

# Print a script's usage: the comment block at its top (lines 2.. up to the first
# non-comment line), without the leading '# '; the options of its table
# (parse_options) after the paragraph that starts with "Usage:".
usage() {
    local line state=0
    while IFS= read -r line; do
        if (( state == 1 )) && [[ -z "$line" ]]; then
            echo
            options_help
            state=2
        fi
        printf '%s\n' "$line"
        if (( state == 0 && ${#_OPT_NAMES[@]} )) && [[ "$line" == Usage:* ]]; then
            state=1
        fi
    done < <(sed -n '2,/^[^#]/{/^#/!q;s/^# \{0,1\}//;p}' "$0")
    if (( state == 1 )); then
        echo
        options_help
    fi
}
_OPT_NAMES=()
