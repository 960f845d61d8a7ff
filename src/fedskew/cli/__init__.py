"""The ``fedskew`` command line: the parser and :func:`main` (the console entry point ``fedskew.cli:main``).

The commands are in :mod:`fedskew.cli.commands`, ``fedskew condense`` in :mod:`fedskew.cli.condense`.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from types import FrameType, TracebackType

from fedskew.cli.commands import (
    cmd_audit,
    cmd_condense,
    cmd_deploy,
    cmd_list,
    cmd_partition,
    cmd_report,
    cmd_run,
)
from fedskew.core.errors import FedskewError
from fedskew.plugins import load_plugins
from fedskew.runs import describe_os_error

EPILOG = """examples:
  fedskew run                                   the default experiment (digits, FedAvg vs centralised)
  fedskew run experiments/fmnist_fedavg.toml rounds=5 partition.alpha=0.5
  fedskew run --resume runs/default/FedAvg-seed0 rounds=50
  fedskew run experiments/fmnist_fedavg.toml --out runs/f --resume   finish an interrupted experiment
  fedskew partition experiments/fmnist_fedavg.toml
  fedskew report runs/default
  fedskew report runs/default --format pdf --preset single --no-titles   figures for one column of a paper
  fedskew audit runs/feddc_cifar10                 privacy of the condensed images FedDC clients sent
  fedskew condense --dataset fashion_mnist --method dm --ipc 10 --iterations 200   condense and score a set
  fedskew condense my_set.toml ipc=10 model.net_width=32   the same from a settings file and overrides
  fedskew list
  fedskew deploy init my-app experiments/fmnist_fedavg.toml rounds=50   a Flower App for `flwr run`
  fedskew run my.toml --import my_algorithm.py   a config naming an algorithm that my_algorithm.py registers
"""

IMPORT_HELP = (
    "import a module or .py file first (repeatable): the algorithms, models, datasets and partitioners it "
    "registers are usable by name"
)


OVERRIDES_HELP = "dotted overrides, e.g. rounds=5 partition.alpha=0.5, anywhere among the options"


def _add_import(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE",
                        help=IMPORT_HELP)



def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fedskew",
        description="Federated learning on skewed (non-IID) client data.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"fedskew {__import__('fedskew').__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    data_help = "folder laid out like shared/datasets (default: $FEDSKEW_DATA, else ~/.cache/fedskew/data)"
    r = sub.add_parser("run", help="run an experiment (default: the built-in default experiment)")
    r.add_argument("config", nargs="?", help="TOML config file or built-in config name (default: default)")
    r.add_argument("overrides", nargs="*", help=OVERRIDES_HELP + "; a list where a key takes one value is a grid: "
                                                "'partition.alpha=[0.1,0.5]'")
    r.add_argument("--out", help="experiment folder (default: runs/<name>, numbered if taken)")
    r.add_argument("--data-dir", help=data_help)
    r.add_argument("--resume", metavar="RUN_DIR", nargs="?", const="",
                   help="continue a run folder from its last checkpoint; without RUN_DIR (CONFIG --out DIR --resume): "
                        "continue the experiment in DIR (finished runs kept, interrupted ones resumed)")
    r.add_argument("--only", nargs="+", metavar="LABEL",
                   help="run only the variants with these labels (a variant's label selects all its grid points; "
                        "a point's full label, that point); a KEY=VALUE word after it whose KEY is a config key "
                        "(rounds=5, partition.alpha=0.5) is an override, not a label")
    r.add_argument("--force", action="store_true", help="overwrite runs already in --out")
    r.add_argument("--label", help="label of the runs (after --only) in tables and plots; {label} is each "
                                   "variant's own label and {KEY} a config value, e.g. "
                                   "--label '{label}, tau={algorithm.tau}'")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_import(r)
    r.set_defaults(func=cmd_run)

    pa = sub.add_parser("partition", help="print per-client class counts and save a bubble plot or heat map")
    pa.add_argument("config", help="TOML config file or built-in config name")
    pa.add_argument("overrides", nargs="*", help=OVERRIDES_HELP)
    pa.add_argument("--out", help="file to write, .png, .pdf or .svg (default: partition-<partitioner>.png in the "
                                  "current folder)")
    pa.add_argument("--style", choices=["auto", "bubble", "heatmap"], default="auto",
                    help="bubbles per client and class, or a heat map (auto: a heat map from 100 clients on)")
    pa.add_argument("--data-dir", help=data_help)
    _add_import(pa)
    pa.set_defaults(func=cmd_partition)

    rp = sub.add_parser("report", help="plots, comparison table and report.html for run folders")
    rp.add_argument("runs", nargs="+", help="run folders or their parents")
    rp.add_argument("--out", help="output folder (default: EXP/report when the runs are those of one experiment "
                                  "folder EXP, also a one-run one; else <common parent>/report)")
    rp.add_argument(
        "--group-by", action="append", metavar="KEY[,KEY]",
        help="config keys whose values tell runs apart in the labels (dataset.name, algorithm.tau, ...; "
             "an option a run left unset shows its default, one its method lacks shows -); runs of "
             "different experiments (dataset, partition, model) under one label are refused",
    )
    rp.add_argument("--label", default="", metavar="TEMPLATE",
                    help="relabel the runs: {label} is a run's own label, {KEY} its value of a config key, e.g. "
                         "--label '{label}, KL {algorithm.kl_reduction}' (as fedskew run --label)")
    rp.add_argument("--format", choices=["png", "pdf", "svg"],
                    help="file format of the figures (default png; a pdf figure also gets the png copy that "
                         "report.html shows, and embeds TrueType fonts, not Type 3). These options default to the "
                         "[report] table of the runs' configs")
    rp.add_argument("--dpi", type=int, help="resolution of raster figures, 50 to 1200 (default 150)")
    rp.add_argument("--preset", choices=["single", "double"],
                    help="figures for a two-column paper: single (one column, 3.3 in wide, 8 pt) or double (both "
                         "columns, 6.9 in, 9 pt); --width and --font-size win over it")
    rp.add_argument("--width", type=float, metavar="INCHES", help="figure width (default: each figure's own, "
                                                                  "7 in for the curves)")
    rp.add_argument("--height", type=float, metavar="INCHES", help="figure height (default: the figure's own "
                                                                   "aspect ratio at that width)")
    rp.add_argument("--font-size", type=float, metavar="POINTS", help="base font size (default 10)")
    rp.add_argument("--no-titles", dest="titles", action="store_false", default=None,
                    help="figures without titles (a paper's caption says what they show)")
    rp.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_import(rp)
    rp.set_defaults(func=cmd_report)

    de = sub.add_parser("deploy", help="run on Flower: write a Flower App folder, or per-client shard files")
    de.add_argument("action", choices=["init", "shards"], help="init: app folder for `flwr run`; shards: data files")
    de.add_argument("folder", help="the app folder (init) or the shard folder (shards)")
    de.add_argument("config", nargs="?", help="TOML config file or built-in config name (default: default)")
    de.add_argument("overrides", nargs="*", help=OVERRIDES_HELP)
    de.add_argument("--data-dir", help=data_help)
    de.add_argument("--label", default="", help="init: the variant to run when the config has several")
    de.add_argument("--force", action="store_true", help="overwrite an existing app folder")
    _add_import(de)
    de.set_defaults(func=cmd_deploy)

    au = sub.add_parser(
        "audit", help="privacy checks on the synthetic images a run's clients sent; adds the table to the report"
    )
    au.add_argument("runs", nargs="+", help="run folders or their parents")
    au.add_argument("--data-dir", help=data_help)
    au.add_argument("--max-images", type=int, default=2000, help="images sampled per run (default 2000)")
    au.add_argument("--epochs", type=int, default=50, help="epochs of the attacked model (default 50)")
    au.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_import(au)
    au.set_defaults(func=cmd_audit)

    co = sub.add_parser(
        "condense", help="condense a dataset (DC, DM, KIP), save the set and score it",
        description="Settings come from an optional TOML file, then KEY=VALUE overrides (dotted, as for `fedskew "
                    "run`: method=kip ipc=10 model.net_width=32 eval.epochs=100), then the flags below, which are "
                    "aliases of those keys. Defaults in brackets.",
    )
    co.add_argument("items", nargs="*", metavar="CONFIG_OR_KEY=VALUE",
                    help="a TOML file of settings (first) and/or dotted overrides")
    co.add_argument("--dataset", help="registered dataset name [digits]")
    co.add_argument("--data-dir", help=data_help)
    co.add_argument("--method", help="dc, dm, kip or random (a random real subset) [dm]")
    co.add_argument("--ipc", type=int, help="images per class [1]")
    co.add_argument("--iterations", type=int,
                    help="condensation iterations [published: DC 1000, DM 20000, KIP 1000]")
    co.add_argument("--seed", type=int, help="seed of condensation and evaluation [0]")
    co.add_argument("--out", help="output folder [runs/condense/<dataset>-<method>-ipc<N>-seed<S>]")
    co.add_argument("--eval-epochs", type=int, help="epochs of the evaluation training (key eval.epochs) [300]")
    co.add_argument("--eval-dsa", action="store_true", default=None, help="DSA augmentation in the evaluation "
                    "training, as DSA and DM evaluate (key eval.dsa) [off, as DC evaluates]")
    co.add_argument("--model", help="network to condense with and evaluate (key model.name) [convnet]")
    co.add_argument("--net-width", type=int, help="ConvNet width (key model.net_width) [128]")
    co.add_argument("--image-lr", type=float, help="image learning rate [DC 0.1, DM 1.0, KIP 0.01]")
    co.add_argument("--real-batch", type=int, help="real images per class per step (KIP: target batch) [256]")
    co.add_argument("--dsa", action=argparse.BooleanOptionalAction, default=None,
                    help="augment while matching [on for DM, off for DC]")
    co.add_argument("--outer-loop", type=int, help="DC matching steps per network [DC's: 1 at ipc 1, 10 at 10]")
    co.add_argument("--inner-loop", type=int, help="DC network steps between them [DC's: 1 at ipc 1, 50 at 10]")
    co.add_argument("--kernel", help="KIP kernel: ntk or rf_convnet [ntk]")
    co.add_argument("--bn-statistics", help="DM with a BatchNorm network: pooled (real and synthetic images "
                    "normalised in one pass) or separate (a pass each, DM's code) [pooled]")
    co.add_argument("--learn-labels", action="store_true", default=None,
                    help="KIP also learns the labels (saved as soft labels)")
    co.add_argument("--threads", type=int, help="torch threads [1: reproducible, fair to others]")
    co.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_import(co)
    co.set_defaults(func=cmd_condense)

    ls = sub.add_parser("list", help="registered algorithms, models, datasets, partitioners, configs")
    _add_import(ls)
    ls.set_defaults(func=cmd_list)
    return p


TRAILING = {"run": "overrides", "partition": "overrides", "deploy": "overrides", "condense": "items",
            "report": "runs", "audit": "runs"}
"""Each command's trailing list of positionals: where words met after an option go (``key=value`` overrides,
or more run folders for ``report`` and ``audit``)."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse a command line, taking ``key=value`` overrides (and a command's other trailing words) anywhere
    among the options: ``fedskew run exp.toml --import x.py rounds=1``, ``fedskew deploy init app exp.toml
    --label X rounds=2``.

    argparse fills a list positional from one run of words only, so words after an option come back
    unrecognised; they are appended, in order, to the command's list (:data:`TRAILING`). ``run`` takes only
    ``key=value`` words there (a second config file is an error), and anything starting with ``-`` stays an
    unrecognised option. ``--only LABEL ...`` takes the words after it as labels, but for ``KEY=VALUE`` words whose KEY
    is a config key (:func:`_is_override`), which are overrides wherever they stand.
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    dest = TRAILING.get(args.command)
    unknown = [w for w in extra if w.startswith("-") or dest is None
               or (dest in ("overrides", "items") and "=" not in w)]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extra:
        setattr(args, dest, [*(getattr(args, dest) or []), *extra])  # type: ignore[arg-type]
    if args.command == "run" and args.only:  # `--only FedAvg rounds=5`: the override is one, not a label
        moved = [w for w in args.only if _is_override(w)]
        args.only = [w for w in args.only if w not in moved] or None
        args.overrides = [*args.overrides, *moved]
        if args.only is None:
            parser.error("--only needs at least one label (the words after it were overrides)")
    return args


def _is_override(word: str) -> bool:
    """Whether ``word`` is ``KEY=VALUE`` with KEY a config key (``rounds``, ``partition.alpha``): an override
    wherever it stands (a label is not written so)."""
    from fedskew.config.files import TOP_LEVEL

    key, eq, _ = word.partition("=")
    dotted = re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", key) is not None
    return bool(eq) and dotted and key.split(".")[0] in TOP_LEVEL


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that a run stops and cleans up exactly as after Ctrl-C."""


STOP_GRACE_S = 5.0
"""Seconds a stopped run (SIGTERM, Ctrl-C) has to wind down before the process ends regardless. Its files
are safe at any moment (checkpoints are written whole and renamed, metrics are rewritten from the checkpoint
on resume), so a stop never waits on a stuck worker pool: under Slurm or Kubernetes a grace period longer
than this is never exceeded, and the run resumes from its last finished round."""

_STOPPING: list[float] = []
_CANCEL = threading.Event()
_REPORTED = threading.Event()  # main has printed the stop's line; the watchdog adds none
"""Set when :func:`main` returns to a caller in the same process (``main([...])`` from Python): its watchdog
must not end that caller. The ``fedskew`` command (``main()``, no arguments) keeps it through the interpreter's
exit, where a stuck pool's exit handler would otherwise hang."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Ctrl-C reaches every process of the terminal's group; SIGTERM only this one. Stop the worker
    # processes too (they would also die with this process, but only after their current job).
    _stop(143, "terminated")
    raise Terminated


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _stop(130, "interrupted")
    raise KeyboardInterrupt


def _stop(code: int, what: str) -> None:
    """Ask the worker processes to end and make sure this process ends within :data:`STOP_GRACE_S` seconds.

    The workers get SIGTERM now and SIGKILL a second later if still alive; a watchdog thread then ends this
    process with ``code`` should the main thread still be winding down (a pool stuck on a dead worker's lock).
    """
    if _STOPPING:
        return  # a second signal: the first one's watchdog is running
    _STOPPING.append(time.monotonic())
    _CANCEL.clear()
    _REPORTED.clear()
    workers = multiprocessing.active_children()
    for child in workers:
        child.terminate()

    def watchdog() -> None:
        time.sleep(1.0)
        for child in workers:
            if child.is_alive():
                child.kill()
        if _CANCEL.wait(max(STOP_GRACE_S - 1.0, 0.0)):
            return
        if not _REPORTED.is_set():
            print(f"fedskew: {what}; a run continues from its last checkpoint with `fedskew run --resume RUN_DIR` "
                  f"(ended after {STOP_GRACE_S:.0f} s of winding down)", file=sys.stderr, flush=True)
        os._exit(code)

    threading.Thread(target=watchdog, name="fedskew-stop-watchdog", daemon=True).start()


def _quiet_peer_resets(hook: object) -> object:
    """``sys.excepthook`` without the traceback multiprocessing's fd-sharing thread prints when a worker
    it was handing a shared tensor to dies mid-handshake (SIGTERM or Ctrl-C while a round is in flight).

    That thread reports the ``ConnectionError`` or ``EOFError`` itself and carries on; a worker that really died is
    reported by the pool (:data:`fedskew.engine.workers.BROKEN`). Everything else goes to ``hook``.
    """

    def excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        sharer = any(f.filename.endswith("resource_sharer.py") for f in traceback.extract_tb(tb))
        if sharer and issubclass(kind, (ConnectionError, EOFError)):
            return
        hook(kind, value, tb)  # type: ignore[operator]

    if getattr(hook, "quiet_peer_resets", False):
        return hook
    excepthook.quiet_peer_resets = True  # type: ignore[attr-defined]
    return excepthook


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every error a user can cause ends in one line ``fedskew: error: ...`` and exit code 2.

    One line, no traceback, for: :class:`FedskewError` (bad input, missing data, a run folder in use),
    ``OSError`` (a full disk, a read-only or unwritable folder, a file where a folder should be), and
    running out of memory (``MemoryError``, PyTorch's failed allocations). Ctrl-C (exit 130) and SIGTERM
    (exit 143) stop a run the same way: its worker processes end and it can continue from its last
    checkpoint.
    """
    args = parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    # Ctrl-C as Python handles it, plus the watchdog; a SIGINT this process was started to ignore stays ignored.
    previous_int = signal.getsignal(signal.SIGINT) if main_thread else None
    if main_thread and previous_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
    if main_thread:
        sys.excepthook = _quiet_peer_resets(sys.excepthook)  # type: ignore[assignment]
    try:
        load_plugins(args.imports)  # before anything runs: a plug-in that fails is one line
        return int(args.func(args))
    except FedskewError as e:
        return _error(str(e))
    except OSError as e:
        return _error(describe_os_error(e))
    except MemoryError as e:
        return _error(f"out of memory ({e or 'MemoryError'}); make the dataset, model or batch smaller")
    except RuntimeError as e:
        if not _out_of_memory(e):
            raise
        return _error(f"out of memory ({str(e).strip().splitlines()[-1]}); make the dataset, model or batch smaller")
    except Terminated:
        _REPORTED.set()
        print("fedskew: terminated; a run continues from its last checkpoint with "
              "`fedskew run --resume RUN_DIR`", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        _REPORTED.set()
        print("fedskew: interrupted; a run continues from its last checkpoint with "
              "`fedskew run --resume RUN_DIR`", file=sys.stderr)
        return 130
    finally:
        if main_thread and previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if main_thread and previous_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous_int)
        if argv is not None:  # called from Python: this process goes on, so no watchdog may end it
            _CANCEL.set()
            _STOPPING.clear()


def _out_of_memory(e: RuntimeError) -> bool:
    """PyTorch reports a failed allocation as a RuntimeError: ``torch.OutOfMemoryError`` on a GPU, a
    message ``DefaultCPUAllocator: can't allocate memory`` on the CPU."""
    return type(e).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(e)


def _error(line: str) -> int:
    print(f"fedskew: error: {' '.join(line.splitlines())}", file=sys.stderr)  # one line, whatever the message
    return 2
