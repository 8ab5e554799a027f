# The steps of one row (run_row: data, training, averaging, evaluation, significance)
# and the results table (write_table). Sourced by common.sh.

# ------------------------------------------------------------------ a row
# run_row i: the commands of row i with the seed SEED, each skipped when its outputs are
# up to date.
run_row() {  # i
    local i="$1" name="${R_NAME[$1]}" run_dir="${R_RUN[$1]}" data="${R_DATA[$1]}"
    local src="${R_SRC[$1]}" tgt="${R_TGT[$1]}"
    load_row "$i"
    note "=== $name: ${R_ARCH[$i]}, ${R_CFG[$i]} (${R_DATASET[$i]}${R_VARIANT[$i]:+ ${R_VARIANT[$i]}} $src-$tgt)$( \
        (( ${#SEEDS[@]} > 1 )) && echo ", seed $SEED") ==="
    if (( ${#SEEDS[@]} > 1 )) && [[ "$run_dir" == "$WORK/runs/$name" ]]; then
        note "$name: seed $SEED: the one-seed run in $run_dir is this seed's run"
    fi
    row_files "$i"
    note "$name: batch: $BATCH_TEXT"
    note "$name: training: $TRAINING_TEXT"

    # data: once per dataset, variant, direction and segmentation
    slurm_row "$i"
    if [[ ! -f "$data/PREPARED" && " $PREPARED_THIS_RUN " != *" $data "* ]]; then
        slurm_job "prepare:${R_DATASET[$i]}" prepare "$i"
        prepare_args "$i"
        emit bash "$PIPELINE_DIR/prepare_data.sh" "${PREP_ARGS[@]}"
        PREPARED_THIS_RUN+=" $data"
    fi

    local score="$ROW_SCORE" ckpt="$ROW_CKPT" xscore="$ROW_XSCORE"
    if [[ -f "$score" && "$score" -nt "$run_dir/checkpoint_last.pt" && "$score" -nt "$ckpt" \
          && ( -z "$xscore" || -f "$xscore" ) ]]; then
        note "$name: trained and evaluated ($score)"
    else
        train_and_evaluate "$i"
    fi
    row_significance "$i"
}

# train_and_evaluate i: train row i (with its configuration and row loaded: load_row's
# FAIRSEQ_ARGS and SIGNATURE, row_files' ROW_CKPT), average or take the best checkpoint,
# and translate and score the test set.
train_and_evaluate() {  # i
    local i="$1" name="${R_NAME[$1]}" run_dir="${R_RUN[$1]}" data="${R_DATA[$1]}"
    local src="${R_SRC[$1]}" tgt="${R_TGT[$1]}" kind="${R_KIND[$1]}" xkind="${R_XKIND[$1]}"
    local ckpt="$ROW_CKPT" hw=() prec=() maxtok=() gen_extra=()
    if (( REHEARSE && REHEARSE_PROCS > 1 )); then
        hw=(--gpus "$REHEARSE_PROCS" --cpu) gen_extra=(--cpu)
    elif (( CPU )); then
        hw=(--cpu) gen_extra=(--cpu)
    else
        hw=(--gpus "$GPUS")
    fi
    if [[ -n "$SLURM_MODE" ]]; then
        slurm_train_hw
        hw=("${HW[@]}")
    fi
    [[ -n "$PRECISION" ]] && prec=(--precision "$PRECISION")
    [[ -n "$MAX_TOKENS" ]] && maxtok=(--max-tokens "$MAX_TOKENS")
    slurm_job "train:$name:$SEED" train "$i" "prepare:${R_DATASET[$i]}"
    emit mkdir -p "$run_dir"
    (( DRY_RUN )) || { mkdir -p "$run_dir"; printf '%s\n' "$SIGNATURE" > "$run_dir/SYSTEM"; }
    emit bash "$PIPELINE_DIR/train.sh" --arch "${R_ARCH[$i]}" --data-bin "$data/bin" --save-dir "$run_dir" \
        --max-update "$MAX_UPDATE" --src "$src" --tgt "$tgt" --seed "$SEED" "${hw[@]}" \
        --effective-tokens "$EFFECTIVE_TOKENS" "${prec[@]}" \
        -- "${FAIRSEQ_ARGS[@]}" "${maxtok[@]}" --log-file "$run_dir/train.log"
    slurm_job "eval:$name:$SEED" eval "$i" "train:$name:$SEED"
    if [[ "${R_TRAINING[$i]}" != early-stop ]] && [[ ! -f "$ckpt" || "$run_dir/checkpoint_last.pt" -nt "$ckpt" ]]; then
        emit bash "$PIPELINE_DIR/average.sh" --save-dir "$run_dir" --last "$AVERAGE_LAST" --by update \
            --output "$ckpt"
    fi
    # sacreBLEU (bleu.json) always; one tokenized BLEU (tok_bleu.json) where the main
    # or the extra column reports it
    local bleu_opts=() k
    for k in "$kind" "$xkind"; do
        case "$k" in
            multi-bleu) bleu_opts=(--tok-bleu) ;;
            tok-compound) bleu_opts=(--tok-bleu --compound-split) ;;
        esac
    done
    local gen=("${GENERATE_ARGS[@]}" "${gen_extra[@]}")
    local tail=()
    (( ${#gen[@]} )) && tail=(-- "${gen[@]}")
    emit bash "$PIPELINE_DIR/evaluate.sh" --data-bin "$data/bin" --checkpoint "$ckpt" --src "$src" --tgt "$tgt" \
        --ref "$data/raw/test.$tgt" --subset test --beam "$BEAM" --lenpen "$LENPEN" --out "$run_dir/eval" \
        "${bleu_opts[@]}" "${tail[@]}"
}

# row_significance i: the significance tests of row i against its baseline row, on the
# main column's BLEU: sacreBLEU's tokenization of the detokenized output, or
# evaluate.sh's tokenized texts as they are (with several seeds, the table's paired
# bootstrap over the seeds instead: seeds_table).
row_significance() {  # i
    local i="$1" name="${R_NAME[$1]}" run_dir="${R_RUN[$1]}" data="${R_DATA[$1]}"
    local tgt="${R_TGT[$1]}" kind="${R_KIND[$1]}" base="${R_BASE[$1]}"
    [[ -n "$RUN_TESTS" && -n "$base" ]] && (( ${#SEEDS[@]} == 1 )) || return 0
    local b j texts=hyp.detok ref="$data/raw/test.$tgt" tok=13a tokenize=()
    if [[ "$kind" == multi-bleu || "$kind" == tok-compound ]]; then
        texts=hyp.tok_bleu ref="$run_dir/eval/ref.tok_bleu" tok=none tokenize=(--tokenize none)
    fi
    for j in "${!R_NAME[@]}"; do [[ "${R_NAME[$j]}" == "$base" ]] && b="$j"; done
    local base_hyp="${R_RUN[$b]}/eval/$texts" hyp="$run_dir/eval/$texts" test out
    if [[ " ${SELECTED[*]} " != *" $b "* && ! -f "$base_hyp" ]]; then
        note "$name: no significance test: the baseline row '$base' is not selected and has no translation yet"
        return 0
    fi
    slurm_job final final "" ""
    for test in $RUN_TESTS; do
        if [[ "$test" == compare-mt ]]; then
            out="$run_dir/significance/significance.json"
        else
            out="$run_dir/paired_bs/paired_bs.json"
        fi
        if [[ -f "$out" && "$out" -nt "$hyp" && "$out" -nt "$base_hyp" ]]; then
            note "$name: $test significance test done ($out)"
        elif [[ "$test" == compare-mt ]]; then
            emit bash "$PIPELINE_DIR/significance.sh" --ref "$ref" --baseline "$base=$base_hyp" \
                --system "$name=$hyp" --samples 1000 "${tokenize[@]}" --out "$run_dir/significance"
        else
            emit "$PY" "$REPRO_DIR/paired_bs.py" --ref "$ref" --baseline "$base=$base_hyp" \
                --system "$name=$hyp" --samples 1000 --tokenize "$tok" --out "$run_dir/paired_bs"
        fi
    done
}

# ------------------------------------------------------------------ table
# Print the Markdown table (paper's numbers next to ours, from the result files that
# exist; scripts/reproduce/results_table.py); written to WORK/results.md unless --dry-run.
print_table() {
    local i out="" rows
    printf -v rows '%s\t' name pair paper_bleu kind extra score extra_score sacrebleu paper_params paper_speed \
        log baseline compare_mt paired_bs config paper_metric test training shares_embeddings arch
    rows="${rows%$'\t'}"$'\n'
    for i in "${!R_NAME[@]}"; do
        load_config "${R_CFG[$i]}"
        row_files "$i"
        local line
        printf -v line '%s\t' "${R_NAME[$i]}" "${R_SRC[$i]}-${R_TGT[$i]}" "${R_BLEU[$i]}" "${R_KIND[$i]}" \
            "${R_XKIND[$i]}" "$ROW_SCORE" "$ROW_XSCORE" \
            "${R_RUN[$i]}/eval/bleu.json" "${R_PARAMS[$i]}" "${R_SPEED[$i]}" "${R_RUN[$i]}/train.log" \
            "${R_BASE[$i]}" "${R_RUN[$i]}/significance/significance.json" "${R_RUN[$i]}/paired_bs/paired_bs.json" \
            "${R_CFG[$i]}" "$PAPER_BLEU" "${R_DATASET[$i]}${R_VARIANT[$i]:+ (${R_VARIANT[$i]})}: ${R_TEST[$i]}" \
            "$TRAINING_TEXT" "${R_SHARES[$i]}" "${R_ARCH[$i]}"
        rows+="${line%$'\t'}"$'\n'
    done
    (( DRY_RUN )) || { mkdir -p "$WORK"; out="$WORK/results.md"; }
    "$PY" "$REPRO_DIR/results_table.py" --title "$TABLE_TITLE" --tests "$RUN_TESTS" --seed "$SEED" --out "$out" <<< "${rows%$'\n'}"
}

# seeds_table: the table over several seeds, by fairseq-localness-results (layout
# reproduce; scripts/results.py runs it without importing fairseq). Its RUNS.tsv has one
# line per row and seed: the run directory, the files of the main column's BLEU (the
# same texts and tokenization as the one-seed significance tests), the extra column's
# score, and the row's display columns (paper numbers, configuration notes). Written to
# WORK/runs.tsv, and the table with every seed's numbers to WORK/results.md,
# results.json and results.tsv, unless --dry-run (then printed only).
seeds_table() {
    local i seed hyp score ref tokenize xscore dir tsv line
    printf -v tsv '%s\t' system seed dir hyp score ref tokenize baseline extra_score pair metric extra_metric \
        paper_bleu paper_params paper_speed shares_embeddings config paper_metric test training arch
    tsv="${tsv%$'\t'}"$'\n'
    for i in "${!R_NAME[@]}"; do
        load_config "${R_CFG[$i]}"
        row_files "$i"  # TRAINING_TEXT
        case "${R_KIND[$i]}" in
            multi-bleu|tok-compound)
                hyp=eval/hyp.tok_bleu score=eval/tok_bleu.json ref=eval/ref.tok_bleu tokenize=none ;;
            *)
                hyp=eval/hyp.detok score=eval/bleu.json ref="${R_DATA[$i]}/raw/test.${R_TGT[$i]}" tokenize=13a
                [[ "$ref" == /* ]] || ref="$PWD/$ref" ;;  # (a relative ref is read from the run directory)
        esac
        kind_json "${R_XKIND[$i]}" ""
        xscore="${KIND_JSON#/}"
        for seed in "${SEEDS[@]}"; do
            seed_run_dir "$i" "$seed"
            if (( DRY_RUN )); then  # (read from standard input: absolute paths)
                dir="$RUN_DIR"
                [[ "$dir" == /* ]] || dir="$PWD/$dir"
            else
                dir="${RUN_DIR#"$WORK"/}"  # relative to WORK/runs.tsv
            fi
            printf -v line '%s\t' "${R_NAME[$i]}" "$seed" "$dir" "$hyp" "$score" "$ref" "$tokenize" "${R_BASE[$i]}" \
                "$xscore" "${R_SRC[$i]}-${R_TGT[$i]}" "${R_KIND[$i]}" "${R_XKIND[$i]}" "${R_BLEU[$i]}" \
                "${R_PARAMS[$i]}" "${R_SPEED[$i]}" "${R_SHARES[$i]}" "${R_CFG[$i]}" "$PAPER_BLEU" \
                "${R_DATASET[$i]}${R_VARIANT[$i]:+ (${R_VARIANT[$i]})}: ${R_TEST[$i]}" "$TRAINING_TEXT" \
                "${R_ARCH[$i]}"
            tsv+="${line%$'\t'}"$'\n'
        done
    done
    local args=(--layout reproduce --title "$TABLE_TITLE" --samples 1000)
    [[ -n "$RUN_TESTS" ]] && args+=(--significance)
    if (( DRY_RUN )); then
        "$PY" "$SCRIPTS_DIR/results.py" "${args[@]}" --runs - <<< "${tsv%$'\n'}"
    else
        mkdir -p "$WORK"
        printf '%s' "$tsv" > "$WORK/runs.tsv"
        "$PY" "$SCRIPTS_DIR/results.py" "${args[@]}" --runs "$WORK/runs.tsv" --out "$WORK"
    fi
}

# the table: over several seeds, or of one run per row
write_table() {
    if (( ${#SEEDS[@]} > 1 )); then
        seeds_table
    else
        print_table
    fi
}
