"""Issues 26's, 35's and 44's case lists, rerun: each case checked by its test(s); prints a row per case and the counts.

    FEDSKEW_DATA=../shared/datasets python benchmarks/integrity.py            # every case
    python benchmarks/integrity.py --section "Run folders and results"        # one section

Every case names the tests that check it (a test function, or one parametrisation ``test[id]``); the
tests run once, in this process, through pytest, and a case passes when all of its tests passed. Tests
run ``fedskew`` as a separate process wherever the case is about the command line, kill it for real
where the case is about processes, and fill a real (small) file system where it is about a full disk.
To add a case, add one :class:`Case` to :data:`CASES`. Exit code 1 when a case failed or was not checked.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI = "tests/test_integrity_cli.py"
FOLDERS = "tests/engine/test_run_folders.py"
DEPLOY = "tests/engine/test_deploy_integrity.py"
CACHE = "tests/data/test_cache_verify.py"
HOSTILE_TESTS = "tests/engine/test_hostile.py"
REPLIES = "tests/engine/test_reliability.py"
FLOWER = "tests/engine/test_flower.py"
ALL_ALGORITHMS = "tests/algorithms/test_all_algorithms.py"
FEDDC = "tests/algorithms/test_feddc.py"
RULES = "tests/engine/test_failure_rules.py"
GRID_TESTS = "tests/test_grids.py"
FAULTS = "tests/engine/test_faults_and_resources.py"


@dataclass(frozen=True)
class Case:
    """One case of the issue and the tests that check it (pytest node ids, relative to the repository)."""

    section: str
    case: str
    tests: tuple[str, ...]


def _bad(override: str) -> str:
    return f"{CLI}::test_bad_values_are_one_line_before_anything_runs[{override}]"


def _damage(kind: str) -> str:
    return f"{CLI}::test_a_damaged_checkpoint_is_one_line_and_changes_nothing[{kind}]"


def _reply(attack: str) -> tuple[str, str]:
    """A hostile reply's test through the real round loop and through Flower's message path."""
    test = f"{HOSTILE_TESTS}::test_a_bad_reply_is_rejected_with_its_reason_and_the_model_stays_sane"
    return f"{test}[{attack}-simulation]", f"{test}[{attack}-flower]"


HOSTILE = "Hostile and broken clients"
RUNS = "Run folders and results"
PROCESSES = "Processes and resources"
INPUT = "Every bad input gets one line, before anything runs"
DEPLOYMENT = "Deployment"
WRITES = "Rule 1: a write that fails part-way is one line"
REPLY = "Rule 2: one client's reply never ends a run"
PLUGIN = "Rule 3: a plug-in never ends fedskew silently"
LABELS = "Rule 4: labels and report keys are checked as names are"
RECORDED = "Rule 5: a recorded config equals itself"
FILES = "Rule 6: every file a resume or report reads may be damaged or hostile"
OPTIONAL = "Rule 7: optional components fail in one line, once"
SIZES = "Rule 8: sizes are bounded before memory is"
STOP = "Rule 9: a stop request ends a run within seconds, every time"
GRIDS = "Issue 44: a grid never runs something other than what its labels say"

CASES: list[Case] = [
    # ---- hostile and broken clients
    Case(HOSTILE, "a reply without `num_samples` rejected with the reason; a reply's scalars are a schema: required, "
                  "a finite whole number, in range (also NaN, negative, 2.5)",
         (*_reply("no_num_samples"), *_reply("fractional"),
          f"{REPLIES}::test_out_of_range_labels_and_bad_metrics_are_rejected")),
    Case(HOSTILE, "`num_samples = 1e12` with weights of 1e4: a claim above the client's shard rejected with the reason",
         _reply("claim")),
    Case(HOSTILE, "two claims of 1.5e308 samples (they overflowed the weight sum to an all-zero model) rejected",
         _reply("huge")),
    Case(HOSTILE, "finite weights of 3e38, and of 1e4 with an honest claim, rejected by the update-norm bound "
                  "(`max_norm_ratio`, on by default: 10 x the round's median)",
         (*_reply("big"), *_reply("large"), f"{HOSTILE_TESTS}::test_robust_rules_by_hand")),
    Case(HOSTILE, "robust aggregation (median, trimmed mean, norm clipping) reaches every model-averaging method; "
                  "the other methods refuse it in one line",
         (f"{HOSTILE_TESTS}::test_robust_rules_by_hand",
          f"{ALL_ALGORITHMS}::test_every_averaging_method_takes_the_robust_rules",
          f"{FEDDC}::test_feddc_averages_through_the_aggregation_table")),
    Case(HOSTILE, "model replacement (`[faults] malicious`): a fixed set of attackers; clipping and trimmed mean "
                  "resist what wrecks FedAvg's mean",
         (f"{HOSTILE_TESTS}::test_model_replacement_flips_and_boosts_the_update",
          f"{HOSTILE_TESTS}::test_attackers_are_a_fixed_fraction_drawn_from_the_seed",
          f"{HOSTILE_TESTS}::test_clipping_and_trimmed_mean_resist_model_replacement")),
    Case(HOSTILE, "every rejection (by the engine or the aggregation rule) in the round's `rejected` with its reason, "
                  "out of `clients` and `samples`",
         (f"{HOSTILE_TESTS}::test_a_bad_reply_is_rejected_with_its_reason_and_the_model_stays_sane",
          f"{REPLIES}::test_engine_survives_hostile_replies")),
    Case(HOSTILE, "a round whose every reply is rejected stops the run with one line naming the round and the "
                  "reasons; nothing half-written",
         (f"{HOSTILE_TESTS}::test_a_round_whose_every_reply_is_rejected_stops_the_run_resumably",
          f"{CLI}::test_a_round_whose_every_reply_is_rejected_stops_the_run_in_one_error_line")),
    Case(HOSTILE, "the hostile replies through the real simulator and through Flower's message path; a garbled "
                  "Flower reply fails its client, not the run",
         (f"{HOSTILE_TESTS}::test_a_bad_reply_is_rejected_with_its_reason_and_the_model_stays_sane",
          f"{HOSTILE_TESTS}::test_a_round_whose_every_reply_is_rejected_stops_the_run_resumably",
          f"{REPLIES}::test_each_hostile_reply_kind_is_rejected",
          f"{FLOWER}::test_garbled_reply_fails_its_client_not_the_run")),
    # ---- run folders and results
    Case(RUNS, "`seed=5` on a config with `seeds` runs seed 5 (sets the seeds); `seed` with `seeds` refused",
         (f"{CLI}::test_seed_on_the_command_line_sets_the_seeds",)),
    Case(RUNS, "`seeds=[0,0]` (and `seeds=[]`) refused, no folder written", (_bad("seeds=[0,0]"), _bad("seeds=[]"))),
    Case(RUNS, "duplicate labels and per-variant seeds refused",
         (f"{CLI}::test_duplicate_labels_and_per_variant_seeds_are_refused",)),
    Case(RUNS, "a second run or `--resume` of a folder in use refused; no round duplicated; lock gone with the process",
         (f"{FOLDERS}::test_a_second_run_or_resume_of_a_busy_folder_is_refused",
          f"{FOLDERS}::test_the_lock_is_exclusive_and_names_its_holder")),
    Case(RUNS, "`--resume DIR rounds=2` below the checkpoint's round refused, nothing changed",
         (f"{CLI}::test_resume_below_the_checkpoint_is_refused",)),
    Case(RUNS, "a checkpoint with `round=99` in a 6-round run refused, nothing changed",
         (_damage("round-beyond-rounds"), _damage("round-beyond-records"))),
    Case(RUNS, "`name=../../x`, `name=\"\"`, absolute and `.` names refused",
         (_bad("name=../../x"), _bad("name="), _bad("name=/tmp/x"), _bad("name=."),
          f"{FOLDERS}::test_experiment_names_stay_inside_runs", f"{FOLDERS}::test_ordinary_names_pass")),
    Case(RUNS, "`--out \"\"` refused", (f"{CLI}::test_an_empty_out_is_refused",)),
    Case(RUNS, "`algorithm.lr=inf`, `nan`, `-inf` (any non-finite float) refused",
         (_bad("algorithm.lr=inf"), _bad("algorithm.lr=nan"), _bad("algorithm.lr=-inf"), _bad("partition.alpha=inf"))),
    Case(RUNS, "`rounds=99999999999999999999` refused; rounds <= 1,000,000, workers <= 1024",
         (_bad("rounds=99999999999999999999"), _bad("rounds=1000001"), _bad("workers=99999"))),
    Case(RUNS, "the dataset cache records `verify`: an unverified entry never serves a verified load",
         (f"{CACHE}::test_an_unverified_entry_never_serves_a_verified_load",
          f"{CACHE}::test_a_verified_entry_serves_both_kinds_of_load")),
    # ---- processes and resources
    Case(PROCESSES, "SIGKILL of the run: its workers and resource tracker end",
         (f"{FOLDERS}::test_workers_die_with_a_killed_run",)),
    Case(PROCESSES, "SIGTERM stops a run as Ctrl-C does (exit 143, workers end) and it resumes byte-identically",
         (f"{FOLDERS}::test_sigterm_stops_a_run_as_ctrl_c_does_and_it_resumes_exactly",)),
    Case(PROCESSES, "SIGTERM or Ctrl-C killing a worker mid fd-handshake: no traceback (the peer's reset is quiet; "
                    "other errors still print)",
         (f"{CLI}::test_a_worker_dying_mid_handshake_leaves_no_traceback_and_other_errors_still_print",
          f"{FOLDERS}::test_sigterm_stops_a_run_as_ctrl_c_does_and_it_resumes_exactly")),
    Case(PROCESSES, "disk full during a checkpoint: one line naming the folder, last checkpoint intact",
         (f"{FOLDERS}::test_a_full_disk_is_one_line_and_the_last_checkpoint_survives[checkpoints/last.pt.tmp]",
          f"{FOLDERS}::test_a_checkpoint_write_that_fails_leaves_the_last_one")),
    Case(PROCESSES, "disk full during a metrics write: one line naming the folder, last checkpoint intact",
         (f"{FOLDERS}::test_a_full_disk_is_one_line_and_the_last_checkpoint_survives[metrics.jsonl]",)),
    Case(PROCESSES, "a real file system filling up during a run: one line, a consistent checkpoint",
         (f"{FOLDERS}::test_a_disk_that_fills_during_a_run_is_one_line",)),
    # ---- every bad input gets one line, before anything runs
    Case(INPUT, "a config that is not UTF-8 (run, partition, deploy init)",
         (f"{CLI}::test_a_config_that_is_not_utf8_is_one_line",)),
    Case(INPUT, "an unreadable config; a folder given as config",
         (f"{CLI}::test_an_unreadable_config_is_one_line", f"{CLI}::test_a_config_that_is_a_folder_is_one_line")),
    Case(INPUT, "`--out` an existing file (kept as it was)",
         (f"{CLI}::test_out_naming_an_existing_file_is_one_line_and_the_file_is_kept",)),
    Case(INPUT, "`--out` on a read-only file system; in a folder without write permission",
         (f"{CLI}::test_out_on_a_read_only_file_system_is_one_line",
          f"{CLI}::test_out_in_an_unwritable_folder_is_one_line",
          f"{FOLDERS}::test_file_system_errors_read_as_one_line_naming_the_place")),
    Case(INPUT, "`name=5`", (_bad("name=5"),)),
    Case(INPUT, "`partition.seed=abc`", (_bad("partition.seed=abc"),)),
    Case(INPUT, "`dataset.image_size=10000000` (was a MemoryError)", (_bad("dataset.image_size=10000000"),)),
    Case(INPUT, "`deploy init` into an existing file (kept as it was)",
         (f"{CLI}::test_deploy_init_into_a_file_is_one_line",)),
    Case(INPUT, "a checkpoint missing keys", (_damage("missing-keys"), _damage("round-not-int"))),
    Case(INPUT, "a checkpoint with wrong shapes", (_damage("wrong-shapes"),)),
    Case(INPUT, "a checkpoint with non-JSON records, or records that are not round records; not a checkpoint at all",
         (_damage("records-not-json"), _damage("records-not-records"),
          f"{CLI}::test_a_checkpoint_that_is_not_one_is_one_line")),
    Case(INPUT, "a config edited after the run (a value, the model, broken TOML, a bad value)",
         (f"{CLI}::test_a_config_edited_after_the_run_is_one_line",)),
    Case(INPUT, "the resume that is allowed still works", (f"{CLI}::test_the_resume_that_is_allowed_still_works",)),
    Case(INPUT, "a bad option in a config's second variant stops `run`, `partition` and `deploy init` before "
                "anything runs or is written",
         (f"{CLI}::test_a_bad_second_variant_stops_everything_before_the_first_runs",)),
    Case(INPUT, "`deploy init` with `partition.alpha=0` writes nothing",
         (f"{CLI}::test_deploy_init_into_a_file_is_one_line",)),
    Case(INPUT, "a model too large for memory (torch's failed allocation)",
         (f"{CLI}::test_a_model_too_large_for_memory_is_one_line",)),
    Case(INPUT, "`faults.attack=nan` (and `inf`) accepted unquoted",
         (f"{CLI}::test_faults_attack_takes_the_documented_words_unquoted",)),
    # ---- deployment
    Case(DEPLOYMENT, "the SuperLink (Control API) bound to 127.0.0.1 by `superlink_command`, `deploy init`'s advice "
                     "and docs/deploy.md's commands (SSH tunnel)",
         (f"{DEPLOY}::test_the_superlink_command_binds_to_localhost",
          f"{DEPLOY}::test_deploy_init_tells_to_start_the_superlink_on_localhost",
          f"{DEPLOY}::test_docs_deploy_starts_the_superlink_on_localhost")),
    Case(DEPLOYMENT, "a SuperNode's data location comes from its node config; the server names no path on it",
         (f"{DEPLOY}::test_a_node_takes_no_path_from_the_server",
          f"{DEPLOY}::test_a_node_refuses_a_server_named_path_before_reading_anything",
          f"{DEPLOY}::test_the_server_sends_the_nodes_no_path")),
    Case(DEPLOYMENT, "a deployment holds its run folder and refuses a shortened resume",
         (f"{DEPLOY}::test_a_deployment_holds_its_run_folder_and_refuses_a_shortened_resume",)),
    # ---- issue 35: the third pass, one section per rule
    Case(WRITES, "a checkpoint write cut off after 8 KiB by the kernel (`ulimit -f`): one line, last.pt intact, "
                 "the resume afterwards byte-identical",
         (f"{RULES}::test_a_checkpoint_write_cut_off_part_way_is_one_line_and_the_run_resumes",)),
    Case(WRITES, "a real tmpfs filled to 8 KiB free: the checkpoint runs out of space part-way, one line; the resume "
                 "tried while still full, the same line",
         (f"{RULES}::test_a_disk_that_fills_in_the_middle_of_a_checkpoint_is_one_line",
          f"{RULES}::test_save_checkpoint_reports_a_failed_write_as_an_os_error")),
    Case(REPLY, "`num_samples = \"12\"` or `True`, an unencodable metric, a reply that is not a Message: rejected as "
                "that client's, with workers = 1 and 2 and on a Ray cluster, records identical across engines",
         (f"{RULES}::test_a_broken_reply_is_that_clients_rejection_with_any_number_of_workers",
          f"{RULES}::test_encoding_and_decoding_never_raise_on_what_a_client_sends",
          "tests/engine/test_ray.py::test_a_broken_reply_on_the_cluster_is_that_clients_rejection")),
    Case(PLUGIN, "a plug-in calling `sys.exit(0)`, raising `SystemExit(3)` or `KeyboardInterrupt` on import: one line "
                 "naming it, exit 2, nothing written",
         (f"{RULES}::test_a_plugin_that_exits_or_interrupts_on_import_is_one_line_naming_it",)),
    Case(LABELS, "`--label ''`, a newline, spaces at the ends, `../../x`, 101 characters, a template giving a newline, "
                 "a table, a list or no key: one line, nothing written; the same in a config file",
         (f"{RULES}::test_a_bad_label_is_one_line_before_anything_is_written",
          f"{RULES}::test_a_bad_label_in_the_config_file_is_refused_too")),
    Case(LABELS, "`report --group-by` refuses a key no run has, a table and a list",
         (f"{RULES}::test_report_group_by_refuses_what_label_refuses",)),
    Case(RECORDED, "a run with `faults.attack=nan` resumes (`--resume DIR` and `--out DIR --resume`)",
         (f"{RULES}::test_a_run_recorded_with_nan_resumes",)),
    Case(FILES, "a truncated last line of a finished run's metrics.jsonl under `run --out DIR --resume`: one line "
                "naming file and line",
         (f"{RULES}::test_a_truncated_metrics_file_of_a_finished_run_is_one_line_under_resume",)),
    Case(FILES, "a run folder that is a symbolic link: refused (run, --resume, --force), nothing written through it",
         (f"{RULES}::test_a_run_folder_that_is_a_link_is_refused_and_nothing_is_written_through_it",)),
    Case(FILES, "a report that cannot be written after the runs finished: exit 1 and one line, never 0",
         (f"{RULES}::test_a_report_that_cannot_be_written_is_not_a_success",)),
    Case(FILES, "a run that fails after it started leaves no .lock and no empty run folder; a retry reuses the folder",
         (f"{RULES}::test_runs_that_fail_leave_no_lock_and_no_empty_folder",)),
    Case(OPTIONAL, "TensorBoard on a read-only folder (a read-only bind mount) or where a file stands: one line, no "
                   "thread traceback, no bytes repr",
         (f"{RULES}::test_tensorboard_on_a_read_only_folder_is_one_line_without_a_thread_traceback",
          f"{RULES}::test_tensorboard_where_a_file_stands_is_one_line")),
    Case(SIZES, "`ipc=1000000000`, local epochs, batch sizes, condensation iterations, server epochs, clients, MLP "
                "widths, fine-tuning epochs, clients_per_round above the clients: one line before anything runs; "
                "`fedskew condense --ipc`; a plug-in's options by the same names",
         (f"{RULES}::test_sizes_beyond_memory_are_one_line_before_anything_runs",
          f"{RULES}::test_condense_bounds_its_sizes",
          f"{RULES}::test_a_plugin_parameter_class_is_bounded_by_the_same_names")),
    Case(STOP, "SIGTERM at a random moment after round 3 of a two-worker run, FEDSKEW_SIGTERM_TRIALS times (20 here): "
               "exit 143 within the grace period, no worker left, metrics and checkpoint kept",
         (f"{RULES}::test_sigterm_ends_a_pooled_run_within_seconds_every_time",)),
    Case(STOP, "a stop whose clean-up hangs (an exit handler sleeping 120 s): the watchdog ends it at 5 s with 143",
         (f"{RULES}::test_a_run_whose_wind_down_hangs_still_ends_within_the_grace_period",)),
    # ---- issue 44: the fourth pass, grids (its failures 1 to 6 and 11 to 13)
    Case(GRIDS, "1. `'algorithm.name=[\"ditto\",\"apfl\"]'` (command line or `[sweep]`) runs each method, keeping the "
                "variants (one naming its own method keeps it); through the real CLI, each run records its method",
         (f"{GRID_TESTS}::test_a_grid_over_the_method_runs_each_named_method",
          f"{GRID_TESTS}::test_a_grid_over_the_method_keeps_the_variants",
          f"{GRID_TESTS}::test_the_default_config_keeps_its_variants_under_a_method_grid",
          f"{GRID_TESTS}::test_a_single_method_on_the_command_line_still_replaces_the_variants",
          f"{GRID_TESTS}::test_the_cli_runs_each_method_of_a_grid_under_its_label")),
    Case(GRIDS, "2. `partition.alpha=0.9` on a config sweeping `partition.alpha`: one run, labelled and run with 0.9",
         (f"{GRID_TESTS}::test_a_plain_override_of_a_swept_key_is_a_grid_of_that_value",)),
    Case(GRIDS, "3. `'algorithm.bogus=[1,2]'` and `[sweep]` typos refused in one line; a key goes to the runs whose "
                "component has it and that do not set it themselves",
         (f"{GRID_TESTS}::test_a_swept_key_that_no_run_has_is_refused",
          f"{GRID_TESTS}::test_a_key_swept_where_some_variants_lack_it_goes_to_the_others",
          f"{GRID_TESTS}::test_keys_that_cannot_be_swept_are_refused",
          f"{GRID_TESTS}::test_the_cli_refuses_a_bad_grid_in_one_line_and_writes_nothing")),
    Case(GRIDS, "4. `--only VARIANT` selects all the variant's grid points; a point's full label still works",
         (f"{GRID_TESTS}::test_only_selects_a_variant_and_all_its_grid_points",)),
    Case(GRIDS, "5. an ordinary grid over three keys has short labels; a label over 100 characters names the sweep "
                "and `--label`, which then works",
         (f"{GRID_TESTS}::test_an_ordinary_grid_over_three_keys_has_short_labels",
          f"{GRID_TESTS}::test_a_label_too_long_names_the_sweep_and_the_way_out")),
    Case(GRIDS, "6. 1000 x 1000 and 100 x 100 values refused before a point is made (time and memory bounded); "
                "the bound counts variants and seeds",
         (f"{GRID_TESTS}::test_a_grid_too_big_is_refused_before_any_point_is_made",
          f"{GRID_TESTS}::test_the_bound_counts_variants_and_seeds_and_allows_its_limit")),
    Case(GRIDS, "11. `seed=[0,1]` (or `seed`/`seeds` in `[sweep]`) runs seeds 0 and 1",
         (f"{GRID_TESTS}::test_a_grid_over_the_seed_is_the_seeds",)),
    Case(GRIDS, "12. `'partition.alpha=[1,1.0]'`, `[0.1,0.10]`, `rounds=[3,3.0]`: one value given twice, refused after "
                "typing",
         (f"{GRID_TESTS}::test_a_value_given_twice_is_refused_after_typing",
          f"{GRID_TESTS}::test_swept_values_are_typed_as_the_option_takes_them")),
    Case(GRIDS, "13. labels with U+202E, U+200B and other invisible or bidirectional characters refused wherever a "
                "label comes from",
         (f"{GRID_TESTS}::test_labels_refuse_invisible_and_bidirectional_characters",
          f"{GRID_TESTS}::test_ordinary_labels_in_any_script_pass")),
    Case(GRIDS, "the rule: for every kind of swept key, from `[sweep]` and the command line, each run is the grid "
                "point its label names",
         (f"{GRID_TESTS}::test_each_run_is_the_grid_point_its_label_names",)),
]
"""The cases of issues 26 and 35, in their order; add a case by adding one entry."""

TRACKER_SERVER = "Faults 1: a tracking server is tried before anything runs"
WHOLE_REPORT = "Faults 2: a report is written whole or not at all"
MEMORY = "Faults 3: memory is estimated jointly before a run starts"
LAST_ROUND = "Faults 4: the last round is always checkpointed"
RUN_FOLDER = "Faults 5: trackers write into the run folder"
HALF_SENT = "Faults 6: a stop never waits on a half-sent reply"

CASES += [
    # ---- issue 44, faults and resources (docs/reliability.md, "The fourth pass")
    Case(TRACKER_SERVER, "an MLflow server on a closed loopback port: one line naming the URI (no password) within "
                         "seconds, not after 255 s of retries, nothing written; the tracker's own check; MLflow's "
                         "retries lowered for the run",
         (f"{FAULTS}::test_an_unreachable_mlflow_server_is_one_line_naming_it_before_anything_runs",
          f"{FAULTS}::test_the_mlflow_tracker_checks_its_server_and_lowers_mlflows_retries")),
    Case(WHOLE_REPORT, "an earlier report folder made read-only (a read-only bind mount), the experiment run again: "
                       "exit 1, one line naming the report folder, the runs kept, the old report unchanged",
         (f"{FAULTS}::test_a_read_only_report_folder_is_exit_1_naming_it_and_the_old_report_stays",)),
    Case(WHOLE_REPORT, "a real tmpfs that fills while the report is written: exit 1, one line naming the report "
                       "folder, no partial report and no temporary folder, `fedskew report` works afterwards",
         (f"{FAULTS}::test_a_disk_that_fills_while_the_report_is_written_leaves_no_partial_report",
          f"{FAULTS}::test_a_report_write_that_fails_part_way_leaves_the_folder_as_it_was")),
    Case(MEMORY, "FedDM with ipc=10000, 100 classes, 3x256x256 images (each value within its bound): one line with "
                 "the estimate and its parts before anything runs, nothing written",
         (f"{FAULTS}::test_sizes_that_multiply_beyond_memory_are_one_line_before_anything_runs",)),
    Case(MEMORY, "each part alone refuses a run: a 65,536-wide ConvNet, four batched 1.1e9-value MLPs, FedAF's "
                 "condensed sets, HFLDD's KIP images; the tiny config's parts counted exactly",
         (f"{FAULTS}::test_every_part_of_the_estimate_can_refuse_a_run",
          f"{FAULTS}::test_the_estimate_counts_what_a_run_holds")),
    Case(MEMORY, "no false refusal: every config in experiments/ and the built-in ones fits a 4 GB machine",
         (f"{FAULTS}::test_every_shipped_config_passes_the_estimate_on_a_small_machine",)),
    Case(LAST_ROUND, "`checkpoint_every = 0`: the finished run is extended with --resume (byte-identical to an "
                     "uninterrupted run), and an experiment's --resume continues it instead of rerunning round 1",
         (f"{FAULTS}::test_checkpoint_every_0_writes_the_last_round_so_a_finished_run_can_be_extended",
          f"{FAULTS}::test_an_experiment_resume_continues_a_run_checkpointed_only_at_the_end")),
    Case(RUN_FOLDER, "W&B offline without WANDB_DIR: its run in <run folder>/wandb, nothing in the current folder, "
                     "no run in the temporary folder",
         (f"{FAULTS}::test_wandb_writes_its_files_into_the_run_folder",)),
    Case(HALF_SENT, "a pool worker stops half-way through sending its result, stopped or crashed: the pool ends in "
                    "seconds (both waited forever before), no semaphore leaked",
         (f"{FAULTS}::test_a_worker_that_dies_mid_reply_never_holds_up_the_pool",)),
    Case(HALF_SENT, "SIGTERM of a two-worker run while a reply is half sent: exit 143 without the watchdog, no "
                    "leaked semaphore, no .lock, the run resumes",
         (f"{FAULTS}::test_sigterm_while_a_reply_is_half_sent_never_waits_for_the_watchdog",)),
    Case(HALF_SENT, "SIGTERM at random moments of a two-worker run with larger replies, FEDSKEW_SIGTERM_TRIALS times "
                    "(20 here): each as above, the last run resumes",
         (f"{FAULTS}::test_sigterm_at_random_moments_of_a_two_worker_run",)),
]
"""Issue 44's faults and resources, in the order of docs/reliability.md's fourth pass."""


class _Outcomes:
    """A pytest plugin collecting each test's outcome (a failed setup or teardown fails the test)."""

    def __init__(self) -> None:
        self.outcome: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        old = self.outcome.get(report.nodeid)
        if report.failed:
            self.outcome[report.nodeid] = "failed"
        elif report.skipped and old != "failed":
            self.outcome[report.nodeid] = "skipped"
        elif report.when == "call" and old is None:
            self.outcome[report.nodeid] = "passed"


def _matches(nodeid: str, test: str) -> bool:
    return nodeid == test or ("[" not in test and nodeid.startswith(test + "["))


def verdict(case: Case, outcome: dict[str, str]) -> str:
    """``passed`` when every test of the case passed; else ``failed``, ``skipped`` or ``not run``."""
    results = []
    for test in case.tests:
        found = [o for nodeid, o in outcome.items() if _matches(nodeid, test)]
        results.extend(found or ["not run"])
    for word in ("failed", "not run", "skipped"):
        if word in results:
            return word
    return "passed"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", help="only the cases of this section")
    parser.add_argument("-v", "--verbose", action="store_true", help="show pytest's output")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if args.section in (None, c.section)]
    if not cases:
        parser.error(f"no section {args.section!r}; sections: {', '.join(dict.fromkeys(c.section for c in CASES))}")
    functions = sorted({t.split("[", 1)[0] for c in cases for t in c.tests})
    os.chdir(ROOT)  # the node ids are relative to the repository
    os.environ.setdefault("FEDSKEW_SIGTERM_TRIALS", "20")  # rule 9's loop: 20 real SIGTERMs (3 in the suite)
    collector = _Outcomes()
    t0 = time.perf_counter()
    pytest.main([*functions, "-p", "no:randomly", "-p", "no:cacheprovider", "-q" if args.verbose else "-qq",
                 "--rootdir", str(ROOT)], plugins=[collector])
    seconds = time.perf_counter() - t0
    counts = {"passed": 0, "failed": 0, "skipped": 0, "not run": 0}
    section = None
    for case in cases:
        if case.section != section:
            section = case.section
            print(f"\n{section}\n\n| case | result | tests |\n|---|---|---|")
        result = verdict(case, collector.outcome)
        counts[result] += 1
        print(f"| {case.case} | {result} | {len(case.tests)} |")
    print(f"\n{len(cases)} cases: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped, "
          f"{counts['not run']} not run ({len(collector.outcome)} tests, {seconds:.0f} s)")
    return 0 if counts["passed"] == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
