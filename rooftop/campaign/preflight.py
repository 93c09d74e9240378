"""What a run needs before it deploys anything: its dataset file, and every engine it deploys installed."""

from pathlib import Path

from rooftop.adapters.processes import get_engine
from rooftop.errors import RooftopError
from rooftop.spec.bench import KEYS, SettingError
from rooftop.spec.campaign import CampaignSpec, apply_lever


def check_engines_installed(spec: CampaignSpec, path: Path | str = "campaign") -> None:
    """What a run needs before it deploys anything: the dataset or trace file where the workload names one
    (checked here, when a run starts or resumes, not when a stored campaign is read for a report), and every
    engine the baseline and the levers deploy installed; else a RooftopError naming the key."""
    try:
        spec.bench_settings().check_dataset_file(KEYS)
    except SettingError as exc:
        table = "bench" if "dataset_path" in spec.bench.model_fields_set else "workload"
        raise RooftopError(f"{path}: {table}.dataset_path: {exc.problem}", exc.fix) from None

    checks = [("deployment.engine", spec.deployment)]
    checks += [(f'lever "{lv.name}"' + (".engine" if lv.engine else ".topology" if lv.topology else ""),
                apply_lever(spec.deployment, [lv])) for lv in spec.levers]
    seen = set()
    for key, dep in checks:
        if (dep.engine, dep.python, dep.topology) in seen:
            continue
        seen.add((dep.engine, dep.python, dep.topology))
        engine = get_engine(dep.engine)
        if not engine.installed(dep.python, dep.topology):
            where = f" for {dep.python}" if dep.python else ""
            raise RooftopError(
                f"{path}: {key}: engine {dep.engine!r} ({dep.topology}) is not installed{where}",
                f"{engine.install_hint()}; or set `python` to an environment that has it",
            )
