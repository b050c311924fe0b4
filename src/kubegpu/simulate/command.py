"""``kubegpu simulate``: replay traces by the FGD paper's method and compare with its table.

Runs every (pods CSV × policy × seed), in worker processes with ``--jobs``, writes
``allocation.csv`` in the paper artifact's layout, ``runs.csv`` (wall time and failed pods per
run), a PNG of the mean curves, and prints the allocation ratio at 100 % arrived.
"""

from __future__ import annotations

import csv
import logging
import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from pathlib import Path

import click

from kubegpu.cli.types import MAX_SEED, FiniteFloatRange, Folder, NonEmptyPath, input_file
from kubegpu.placement.device_order import (
    CardChoice,
    check_steerable,
    parse_card_choice,
)
from kubegpu.placement.policies import (
    DEFAULT_POLICY,
    POLICIES,
    PolicySpec,
    get_policy,
    names_in_prose,
    simulator_policies,
)
from kubegpu.simulate.arrivals import load_fixture
from kubegpu.simulate.bound import SolverMissing, solver
from kubegpu.simulate.jobs import MIG_LABELS, Job, JobResult, run_job
from kubegpu.simulate.memory_only import VARIANTS as MEMORY_VARIANTS
from kubegpu.simulate.memory_only import UnknownModel, with_card_memory
from kubegpu.simulate.replay import COLUMNS
from kubegpu.simulate.traces import TraceError, load_nodes, load_pods

log = logging.getLogger(__name__)


# Each seed is one replay of every policy; past this a typo (1-5000000) would only build a
# list of jobs for minutes and never finish, where a real study uses tens.
MAX_SEEDS = 10_000
# Inflation multiplies the trace's pods; ten times is already far past any cluster's capacity.
MAX_INFLATION = 10.0


def parse_seeds(text: str) -> list[int]:
    """``42-51`` or ``42,45,50`` (or a mix) → sorted unique seeds, at most :data:`MAX_SEEDS`."""
    seeds: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, sep, high = part.partition("-")
        try:
            first, last = (int(low), int(high)) if sep else (int(part), int(part))
        except ValueError:
            raise click.BadParameter(
                f"not a seed or range: {part!r}", param_hint="--seeds"
            ) from None
        if last < first:
            raise click.BadParameter(
                f"range {part!r} is reversed; did you mean {last}-{first}?", param_hint="--seeds"
            )
        if last > MAX_SEED:  # the generators take 32-bit seeds
            raise click.BadParameter(f"seed {last} is more than {MAX_SEED}", param_hint="--seeds")
        if last - first + 1 + len(seeds) > MAX_SEEDS:
            raise click.BadParameter(
                f"{text!r} is more than {MAX_SEEDS} seeds", param_hint="--seeds"
            )
        seeds.update(range(first, last + 1))
    if not seeds:
        raise click.BadParameter("no seeds", param_hint="--seeds")
    return sorted(seeds)


def parse_policies(text: str) -> list[PolicySpec]:
    specs: list[PolicySpec] = []
    for part in text.split(","):
        if part.strip().lower() == "all":
            specs.extend(simulator_policies())
            continue
        try:
            specs.append(get_policy(part))
        except KeyError as exc:
            raise click.BadParameter(str(exc.args[0])) from None
    return list(dict.fromkeys(specs))


def parse_card_choices(text: str) -> list[CardChoice]:
    """``policy,first-fit,steered`` (any of them, comma-separated) → card choices in order."""
    choices: list[CardChoice] = []
    for part in text.split(","):
        if not part.strip():
            continue
        try:
            choices.append(parse_card_choice(part))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--card-choice'") from None
    if not choices:
        raise click.BadParameter("no card choice", param_hint="'--card-choice'")
    return list(dict.fromkeys(choices))


PaperTable = dict[tuple[str, str], dict[int, list[float]]]


def read_paper(path: Path) -> PaperTable:
    """(workload, label) → seed → columns 0…130, from the paper artifact's CSV."""
    out: PaperTable = defaultdict(dict)
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            for row in reader:
                try:
                    values = [float(row[str(x)]) for x in COLUMNS]
                    seed = int(row["seed"])
                    key = (row["workload"], row["sc_policy"])
                except (KeyError, ValueError, TypeError):
                    raise TraceError(path, reader.line_num, "", "bad paper row") from None
                out[key][seed] = values
    except OSError as exc:
        raise TraceError(path, 0, "", f"cannot open: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(path, 0, "", f"not UTF-8 text (byte offset {exc.start})") from None
    return out


def _write_allocation(out: Path, results: Sequence[JobResult], inflation: float) -> Path:
    path = out / "allocation.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["workload", "sc_policy", "tune", "seed", "total_gpus", *COLUMNS])
        for r in sorted(results, key=lambda r: (r.job.workload, r.job.label, r.job.seed)):
            writer.writerow(
                [
                    r.job.workload,
                    r.job.label,
                    inflation,
                    r.job.seed,
                    r.total_gpus,
                    *("" if v is None else v for v in r.columns),
                ]
            )
    runs = out / "runs.csv"
    with runs.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["workload", "sc_policy", "seed", "failed_pods", "wall_s", "cpu_s", "max_rss_mib"]
        )
        for r in results:
            writer.writerow(
                [
                    r.job.workload,
                    r.job.label,
                    r.job.seed,
                    r.failed_pods,
                    f"{r.wall_s:.2f}",
                    f"{r.cpu_s:.2f}",
                    f"{r.max_rss_mib:.1f}",
                ]
            )
    return path


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _summary(results: Sequence[JobResult], paper: PaperTable) -> None:
    from rich.console import Console
    from rich.table import Table

    grouped: dict[tuple[str, str], list[JobResult]] = defaultdict(list)
    for r in results:
        grouped[(r.job.workload, r.job.label)].append(r)
    table = Table(title="GPU allocation ratio (%) at 100 % arrived, mean over seeds")
    for name in ("workload", "policy", "seeds", "ours", "paper", "Δ", "exact rows"):
        table.add_column(name, justify="left" if name in ("workload", "policy") else "right")
    for (workload, label), rs in sorted(grouped.items()):
        ours = _mean([r.columns[100] or 0.0 for r in rs])
        published = paper.get((workload, label), {})
        if published:
            # Compare over the same seeds when the paper has them all, else over all of its.
            same = [published[r.job.seed][100] for r in rs if r.job.seed in published]
            theirs = _mean(same if len(same) == len(rs) else [v[100] for v in published.values()])
            exact = sum(1 for r in rs if published.get(r.job.seed) == r.columns)
            cells = [f"{theirs:.2f}", f"{ours - theirs:+.2f}", f"{exact}/{len(rs)}"]
        else:
            cells = ["–", "–", "–"]
        short = workload.removeprefix("openb_pod_list_")
        table.add_row(short, label, str(len(rs)), f"{ours:.2f}", *cells)
    Console().print(table)


def _plot(out: Path, results: Sequence[JobResult]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = sorted({r.job.workload for r in results})
    cols = min(4, len(workloads))
    rows = (len(workloads) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.5 * rows), squeeze=False)
    for ax, workload in zip(axes.flat, workloads, strict=False):
        by_policy: dict[str, list[list[float | None]]] = defaultdict(list)
        for r in results:
            if r.job.workload == workload:
                by_policy[r.job.label].append(r.columns)
        for label, curves in sorted(by_policy.items()):
            xs = [x for x in COLUMNS if all(c[x] is not None for c in curves)]
            ys = [_mean([float(c[x] or 0.0) for c in curves]) for x in xs]
            # The bound and the offline packing have one column: a marker, not a line.
            ax.plot(xs, ys, label=label, linewidth=1, marker="o" if len(xs) == 1 else None)
        ax.set_title(workload.removeprefix("openb_pod_list_"))
        ax.set_xlabel("arrived GPU demand (% of capacity)")
        ax.set_ylabel("GPU allocation ratio (%)")
        ax.set_xlim(60, 130)
        ax.set_ylim(60, 100)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(workloads) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    path = out / "allocation.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _card_choice_help() -> str:
    """``--card-choice``'s help, its lists of policies from their card rules in the registry."""
    rules = [(p.name, p.cards) for p in POLICIES.values()]
    searched = names_in_prose(name for name, rule in rules if rule.searched_order)
    keyed = names_in_prose((name for name, rule in rules if rule.keys is not None), "and")
    neither = names_in_prose(name for name, rule in rules if not rule.publishable)
    return (
        "How a GPU share's card is chosen on the policy's node, comma-separated to compare: "
        "'policy' (the policy's own choice), 'first-fit' (DRA's allocator: the first card in "
        "device index order that fits) or 'steered' (first fit in the order a steering DRA "
        f"driver would publish: for {searched} the order minimising the expected cost of the "
        f"workload's next share, for {keyed} their own card order; not {neither}). Other than "
        "'policy', sc_policy gets the choice appended, e.g. '07-Kubegpu first-fit'."
    )


@click.command("simulate")
@click.option(
    "--nodes",
    "nodes_csv",
    required=True,
    type=NonEmptyPath(path_type=Path),
    help="Node list CSV (sn, cpu_milli, memory_mib, gpu, model).",
)
@click.option(
    "--pods",
    "pods_csvs",
    required=True,
    multiple=True,
    type=NonEmptyPath(path_type=Path),
    help="Pod list CSV; repeat for several workloads.",
)
@click.option(
    "--policy",
    "policies",
    default=DEFAULT_POLICY,
    show_default=True,
    callback=lambda _ctx, _param, value: parse_policies(value),
    help=f"Comma-separated policies ({', '.join(p.name for p in simulator_policies())}, or 'all').",
)
@click.option(
    "--seeds",
    default="42-51",
    show_default=True,
    callback=lambda _ctx, _param, value: parse_seeds(value),
    help=f"Arrival orders to replay: e.g. 42-51 or 42,44 (at most {MAX_SEEDS}).",
)
@click.option(
    "--inflation",
    default=1.3,
    show_default=True,
    type=FiniteFloatRange(min=0, max=MAX_INFLATION, min_open=True),
    help="Arrived GPU demand as a multiple of capacity.",
)
@click.option(
    "--arrivals",
    "arrivals_dir",
    type=Folder(writable=False, must_exist=True),
    default=None,
    help="Directory of <pods stem>_seed<S>.txt.gz arrival fixtures.",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=Folder(),
    help="Folder for allocation.csv, runs.csv and allocation.png (made if missing).",
)
@click.option(
    "--jobs",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Replays run at once, each in its own process (at most the CPU count).",
)
@click.option(
    "--card-choice",
    "card_choices",
    default=CardChoice.POLICY.value,
    show_default=True,
    callback=lambda _ctx, _param, value: parse_card_choices(value),
    help=_card_choice_help(),
)
@click.option(
    "--paper",
    "paper_csv",
    type=input_file(),
    default=None,
    help="The paper's allocation CSV, to compare against.",
)
@click.option(
    "--bound",
    is_flag=True,
    help="Also compute, per workload and seed, an upper bound on the allocation ratio at "
    "100 % arrived (no placement of the same arrived pods allocates more) and an offline "
    "packing found with hindsight (rows 'Upper bound' and 'Offline packing'; needs HiGHS: "
    "pip install 'kubegpu[bound]').",
)
@click.option(
    "--mig",
    is_flag=True,
    help="Also replay the same arrivals as MIG requests on H100 MIG cards partitioned on "
    "demand (rows 'MIG first-fit' and 'MIG pack'; docs/mig.md): each share asks for the "
    "smallest profile with its compute, a whole GPU for the 7g instance.",
)
@click.option(
    "--memory-only",
    type=click.Choice(MEMORY_VARIANTS),
    default=None,
    help="Replay the trace with every GPU share asking for card memory alone, as gpushare's "
    "and Volcano's pods do (docs/sharing.md, 'Memory-only shares'): 'openb' asks the share's "
    "fraction of the most common card it may use, 'gpushare' a whole number of GiB drawn "
    "uniformly up to that card's; cards get their models' memory.",
)
@click.option(
    "--plot/--no-plot",
    default=True,
    show_default=True,
    help="Also draw the mean allocation curves into allocation.png.",
)
@click.pass_context
def simulate(
    ctx: click.Context,
    nodes_csv: Path,
    pods_csvs: tuple[Path, ...],
    policies: list[PolicySpec],
    seeds: list[int],
    inflation: float,
    arrivals_dir: Path | None,
    out_dir: Path,
    jobs: int,
    card_choices: list[CardChoice],
    paper_csv: Path | None,
    bound: bool,
    mig: bool,
    memory_only: str | None,
    plot: bool,
) -> None:
    """Replay GPU traces through the placement engine by the FGD paper's method."""
    specs, seed_list = policies, seeds
    if memory_only is not None and (bound or mig):
        other = "--bound" if bound else "--mig"
        raise click.BadParameter(
            f"cannot be combined with {other}, which model compute shares",
            param_hint="'--memory-only'",
        )
    if bound:
        try:
            solver()
        except SolverMissing as exc:
            raise click.BadParameter(str(exc), param_hint="'--bound'") from None
    if CardChoice.STEERED in card_choices:
        for spec in specs:
            try:
                check_steerable(spec)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint="'--card-choice'") from None
    _prepare_out(out_dir)
    try:
        nodes = load_nodes(nodes_csv)
        if memory_only is not None:
            with_card_memory(nodes)  # every model's memory known, or exit 2 here
        pods_by_file = {p: load_pods(p) for p in pods_csvs}
        paper = read_paper(paper_csv) if paper_csv is not None else {}
    except (TraceError, UnknownModel) as exc:
        click.echo(f"error: {exc}", err=True)
        ctx.exit(2)
        return
    work: list[Job] = []
    for pods_csv in pods_csvs:
        for seed in seed_list:
            fixture = None
            if arrivals_dir is not None:
                fixture = arrivals_dir / f"{pods_csv.stem}_seed{seed}.txt.gz"
                if not fixture.is_file():
                    click.echo(f"error: {fixture}: no arrival fixture for seed {seed}", err=True)
                    ctx.exit(2)
                    return
                try:  # validate once here, so workers never fail on input
                    load_fixture(fixture, pods_by_file[pods_csv], nodes)
                except TraceError as exc:
                    click.echo(f"error: {exc}", err=True)
                    ctx.exit(2)
                    return
            for spec in specs:
                for choice in card_choices:
                    work.append(
                        Job(
                            nodes_csv,
                            pods_csv,
                            fixture,
                            spec.name,
                            seed,
                            inflation,
                            choice,
                            memory_only or "",
                        )
                    )
            if bound:
                work += [Job(nodes_csv, pods_csv, fixture, name, seed, inflation)
                         for name in ("bound", "offline")]  # fmt: skip
            if mig:
                work += [Job(nodes_csv, pods_csv, fixture, name, seed, inflation)
                         for name in MIG_LABELS]  # fmt: skip
    log.info(
        "simulating %d runs (%d workloads × %d policies × %d seeds) with %d jobs",
        len(work),
        len(pods_csvs),
        len(specs),
        len(seed_list),
        jobs,
    )
    results = _run_all(work, jobs)
    path = _write_allocation(out_dir, results, inflation)
    click.echo(f"wrote {path}")
    _summary(results, paper)
    if plot:
        click.echo(f"wrote {_plot(out_dir, results)}")


def _prepare_out(out_dir: Path) -> None:
    """Make ``--out`` now, so a folder that cannot be written fails before the replays, not
    after them."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".kubegpu-write-probe"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise click.BadParameter(
            f"cannot write to {out_dir}: {exc.strerror or exc}", param_hint="'--out'"
        ) from None


def _run_all(work: Sequence[Job], jobs: int) -> list[JobResult]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    # Heavy runs first so the last worker is not left with one long job.
    ordered = sorted(work, key=lambda j: (j.policy not in ("fgd", "kubegpu"), j.workload))
    results: list[JobResult] = []
    columns = (
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, transient=False, disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task("replaying", total=len(ordered))
        if jobs == 1:
            for job in ordered:
                results.append(run_job(job))
                progress.advance(task)
            return results
        with ProcessPoolExecutor(max_workers=min(jobs, os.cpu_count() or 1)) as pool:
            futures: list[Future[JobResult]] = [pool.submit(run_job, j) for j in ordered]
            for future in as_completed(futures):
                results.append(future.result())
                progress.advance(task)
    return results
