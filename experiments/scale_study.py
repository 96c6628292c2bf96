r"""The paper's central result in miniature: ViT vs BiT ResNet as the pretraining data grows.

  python -m experiments.scale_study                # the full profile (39 minutes on 2 cores)
  python -m experiments.scale_study --quick        # the same code paths, tiny budgets (tests)

The ViT paper (§4.3, Fig. 3-5) finds that on small pretraining sets ViT transfers worse than
BiT ResNets and catches up or overtakes them as the set grows, for less compute. Here:

  1. pretrain a small ViT and a small BiT ResNet of comparable cost (FLOPs per step) on nested
     random subsets of Fashion-MNIST's 60k training images (`train[:3750]`, `train[:15000]`,
     `train`: the builtin datasets' slices), each with the same `python -m vit_jax.main` stage
     (configs/pretrain.py), the same recipe and the same number of steps, as the paper trains its
     JFT subsets with the same hyperparameters;
  2. record each run's pretraining compute: the model FLOPs of the trainer's own train
     step (vit_jax.train.make_train_step) times the steps;
  3. transfer to Animal-MNIST and MNIST-5k: few-shot linear (the closed-form evaluator of
     vit_jax.evaluators, on the frozen representation) and fine-tuning (configs/finetune.py),
     the learning rate picked on a held-out 2% of the downstream training set (`train[98%:]`,
     fine-tuning on `train[:98%]`) as the paper does, then top-1 on the test split;
  4. the few-shot transfer of the full-data runs' intermediate checkpoints, for the
     accuracy-vs-compute curves (with --quick: of the largest subset's);
  5. raw-pixel baselines (vit_jax/evaluators/baselines.py: scikit-learn logistic regression and kNN-3 on
     pixels / 255) on exactly the same training examples and test split as each transfer number.

Outputs in --out (default experiments/results/scale_study/; with --quick, <workdir>/results/):
`results.json`, `results.md` (the table), `accuracy_vs_data.png` and `accuracy_vs_compute.png`.
The stages' workdirs live under --workdir (default /tmp/vit_scale_study), with the study's state
(`results.json`: what is done and measured). Every stage's command is printed. The study is
resumable: a finished run leaves `metrics.json` in its workdir and is skipped on a rerun; an
interrupted training stage resumes from its last checkpoint.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import dataclasses
import json
import os
import time
import types
from typing import Any

from absl import flags

from experiments import common, fingerprint
from vit_jax.evaluators import baselines
from vit_jax.runtime import cli

WORKDIR = "/tmp/vit_scale_study"
UPSTREAM = "fashion_mnist"
UPSTREAM_TRAIN = 60_000
DOWNSTREAM = ("animal_mnist", "mnist_5k")
# Fine-tuning: the paper's protocol, learning rate picked on a held-out 2% of the training set.
FINETUNE_TRAIN, MINIVAL = "train[:98%]", "train[98%:]"
PP_EVAL = "decode|resize|value_range(-1, 1)"

# The two families, as `python -m vit_jax.main` flags on top of a preset. The ViT is the demo's
# ('demo': patch 4 on 32px, 64 tokens + class token, width 64, 4 layers); the BiT is BiT-R26x1
# (base width 32, the least GroupNorm's 32 groups allow). Their train steps' FLOPs are in the
# table.
FAMILIES = {
  "ViT": dict(preset="demo"),
  "BiT": dict(preset="R26x1"),
}


@dataclasses.dataclass(frozen=True)
class Profile:
  """Sizes of one study profile."""

  fractions: tuple[int, ...]  # pretraining set = the first 60000 / f images of a fixed shuffle
  pretrain_steps: int
  batch_size: int
  image_size: int
  finetune_steps: int
  finetune_datasets: tuple[str, ...]
  learning_rates: tuple[float, ...]
  shots: int
  curve_points: int  # checkpoints of the full-data runs evaluated for the compute curves
  eval_batch_size: int
  runlocal: bool = False  # the configs' `runlocal`: tiny upstream evaluations


# 39 minutes on 2 cores (measured at 3e5c302, the test suite running beside it for part of the
# time): 6 pretraining runs (ViT 1.5-2.5 min, BiT 3.5-6 min each), 12 fine-tuning runs, the
# few-shot evaluations and the pixel baselines. Fine-tuning covers Animal-MNIST only (MNIST-5k
# would double that part); both sets get few-shot transfer.
FULL = Profile(
  fractions=(16, 4, 1),
  pretrain_steps=500,
  batch_size=128,
  image_size=32,
  finetune_steps=200,
  finetune_datasets=DOWNSTREAM[:1],
  learning_rates=(0.01, 0.1),
  shots=10,
  curve_points=4,
  eval_batch_size=500,
)
QUICK = Profile(
  fractions=(16,),
  pretrain_steps=6,
  batch_size=16,
  image_size=16,
  finetune_steps=3,
  finetune_datasets=DOWNSTREAM[:1],
  learning_rates=(0.01,),
  shots=2,
  curve_points=2,
  eval_batch_size=250,
  runlocal=True,
)


def _runlocal(profile: Profile) -> str:
  return ",runlocal" if profile.runlocal else ""


def pretrain_args(family: str, fraction: int, profile: Profile) -> list[str]:
  """Flags of the pretraining stage of `family` on 1/fraction of Fashion-MNIST's train split."""
  split = "train" if fraction == 1 else f"train[:{UPSTREAM_TRAIN // fraction}]"
  steps = profile.pretrain_steps
  arg = f"dataset={UPSTREAM},model={FAMILIES[family]['preset']}" + _runlocal(profile)
  return [
    f"--config=configs/pretrain.py:{arg}",
    f"--config.dataset.train_split={split}",
    f"--config.dataset.image_size={profile.image_size}",
    f"--config.total_steps={steps}",
    f"--config.batch_size={profile.batch_size}",
    f"--config.eval_batch_size={profile.eval_batch_size}",
    f"--config.schedule.warmup_steps={max(steps // 10, 1)}",
    "--config.evals.val.every_steps=0",  # after the last step only
    *(f"--config.evals.fewshot_{name}.every_steps=0" for name in DOWNSTREAM),
    f"--config.checkpoint.every_steps={max(steps // profile.curve_points, 1)}",
    f"--config.checkpoint.keep={profile.curve_points}",
    f"--config.log_every_steps={max(steps // 10, 1)}",
  ]


def finetune_args(
  family: str, pretrained: str, dataset: str, lr: float, profile: Profile
) -> list[str]:
  """Flags of fine-tuning `pretrained` on `dataset`'s train[:98%], validated on train[98%:]."""
  steps = profile.finetune_steps
  return [
    f"--config=configs/finetune.py:dataset=animal_mnist,model={FAMILIES[family]['preset']}"
    + _runlocal(profile),
    f"--config.model_init={pretrained}",
    f"--config.dataset.name={dataset}",
    f"--config.dataset.train_split={FINETUNE_TRAIN}",
    f"--config.dataset.image_size={profile.image_size}",
    f"--config.evals.val.split={MINIVAL}",
    "--config.evals.val.every_steps=0",
    f"--config.schedule.base_lr={lr}",
    f"--config.schedule.warmup_steps={max(steps // 10, 1)}",
    f"--config.total_steps={steps}",
    f"--config.batch_size={profile.batch_size}",
    f"--config.eval_batch_size={profile.eval_batch_size}",
    f"--config.checkpoint.every_steps={steps}",
    f"--config.log_every_steps={max(steps // 5, 1)}",
  ]


def select_learning_rate(minival: dict[float, float]) -> float:
  """The paper's choice: the learning rate with the best held-out (minival) top-1.

  Args:
    minival: learning rate -> top-1 on the held-out 2% of the downstream training set.

  Returns:
    The best learning rate; ties go to the smaller one.
  """
  if not minival:
    raise ValueError("no fine-tuning run to select a learning rate from")
  return max(sorted(minival), key=lambda lr: minival[lr])


# ---------------------------------------------------------------------------------------------
# In-process measurements: FLOPs, few-shot transfer, test top-1, raw-pixel baselines.


def _stage_config(workdir: str):
  import ml_collections

  with open(os.path.join(workdir, "config.json")) as f:
    return ml_collections.ConfigDict(json.load(f))


def train_step_flops(workdir: str) -> float:
  """The model FLOPs of one train step of the run in `workdir` (its saved stage config).

  What the trainer's MFU counts (vit_jax.cost.flops): 3 x the forward pass's matmuls and
  convolutions per image, times the batch, whichever attention and LayerNorm kernels run (XLA's
  cost analysis of the compiled step does not see the C++ kernels' custom calls, which would
  drop the ViT's attention core). Read from the planner's report of the run's own step on one
  device, which holds the whole batch.
  """
  import jax

  from vit_jax.tools import plan

  config = _stage_config(workdir)
  config.mesh = dict(data=1, fsdp=1, model=1)
  step = plan.plan(config, "cpu", num_classes=10, devices=jax.devices()[:1])
  return float(step.model_flops)


def _dataset(name: str, profile: Profile) -> dict[str, Any]:
  return dict(
    source="builtin",
    name=name,
    image_size=profile.image_size,
    train_split="train",
    eval_split="test",
    pp_eval=PP_EVAL,
  )


class FewShot:
  """The few-shot linear evaluator (vit_jax.evaluators) on each downstream set, built once so
  that every model is scored on the same k examples per class and the same test split."""

  def __init__(self, profile: Profile):
    from vit_jax import evaluators

    self.profile = profile
    make_data = evaluators.input_pipeline_data()
    bs = profile.eval_batch_size
    self.evaluators = {
      name: evaluators.FewShotEvaluator(
        None,  # the representation function, set per model
        make_data(_dataset(name, profile), "train", bs),
        make_data(_dataset(name, profile), "test", bs),
        10,
        shots=(profile.shots,),
        name=name,
      )
      for name in DOWNSTREAM
    }

  def __call__(self, checkpoint_path: str) -> dict[str, float]:
    """{dataset: k-shot top-1} of the pretrained representation in `checkpoint_path`."""
    from vit_jax import checkpoint, evaluators

    model_config, params, _ = checkpoint.load_backbone(checkpoint_path)
    model, params = checkpoint.representation_model(
      model_config, params, "pre_logits", self.profile.image_size
    )
    fn = evaluators.representation_fn(model)
    out = {}
    for name, evaluator in self.evaluators.items():
      evaluator.fn = fn
      out[name] = evaluator.run(params)[f"{name}/{self.profile.shots}shot"]
    return out

  def training_rows(self, name: str) -> Any:
    """Positions in the train split of the k-shot examples of downstream set `name`."""
    evaluator = self.evaluators[name]
    positions, _ = evaluator.sample()
    return positions[evaluator.subset(self.profile.shots)]


def test_accuracy(workdir: str, dataset: str, profile: Profile) -> float:
  """Top-1 on `dataset`'s test split of the fine-tuned model in `workdir`."""
  from vit_jax import checkpoint, evaluators, models

  model_config, params, _ = checkpoint.load_backbone(workdir)
  model = models.get_model(model_config, 10)
  make_data = evaluators.input_pipeline_data()
  evaluator = evaluators.ClassificationEvaluator(
    evaluators.predict_fn(model),
    make_data(_dataset(dataset, profile), "test", profile.eval_batch_size),
    name="test",
  )
  return evaluator.run(params)["test/accuracy"]


def _cached(results: dict, key: str, fn):
  if key not in results:
    results[key] = fn()
  return results[key]


# ---------------------------------------------------------------------------------------------
# The study.


def _pretrain_dir(workdir: str, family: str, fraction: int) -> str:
  return os.path.join(workdir, "pretrain", family, f"1of{fraction}")


def _finetune_dir(workdir: str, family: str, fraction: int, dataset: str, lr: float) -> str:
  return os.path.join(workdir, "finetune", family, f"1of{fraction}", dataset, str(lr))


def stage_flags(profile: Profile, workdir: str) -> dict[str, list[str]]:
  """Every training stage of `profile` by its workdir under `workdir`: its flags."""
  stages = {}
  for family in FAMILIES:
    for fraction in profile.fractions:
      pre_dir = _pretrain_dir(workdir, family, fraction)
      stages[os.path.relpath(pre_dir, workdir)] = pretrain_args(family, fraction, profile)
      for dataset in profile.finetune_datasets:
        for lr in profile.learning_rates:
          where = _finetune_dir(workdir, family, fraction, dataset, lr)
          stages[os.path.relpath(where, workdir)] = finetune_args(
            family, pre_dir, dataset, lr, profile
          )
  return stages


def run_study(workdir: str, profile: Profile) -> dict[str, Any]:
  """Runs every stage not finished yet, then measures; returns (and writes) results.json."""
  os.makedirs(workdir, exist_ok=True)
  results_path = os.path.join(workdir, "results.json")
  results: dict[str, Any] = {}
  if os.path.exists(results_path):
    with open(results_path) as f:
      results = json.load(f)
  profile_dict = json.loads(json.dumps(dataclasses.asdict(profile)))  # tuples as JSON lists
  if results.get("profile", profile_dict) != profile_dict:
    raise SystemExit(
      f"{workdir} holds a study of another profile ({results['profile']}); "
      "use another --workdir (or remove it)"
    )
  results["profile"] = profile_dict
  runs = results.setdefault("runs", {})
  cache = results.setdefault("measured", {})

  def save():
    with open(results_path, "w") as f:
      json.dump(results, f, indent=2, sort_keys=True)

  fewshot = FewShot(profile)
  start = time.perf_counter()
  flags = stage_flags(profile, workdir)
  # What the stages read (experiments/fingerprint.py): the largest pretraining set's images and
  # the fine-tuning's, the same for both families.
  first = _pretrain_dir("", "ViT", min(profile.fractions))
  tuned = _finetune_dir("", "ViT", min(profile.fractions), DOWNSTREAM[0], profile.learning_rates[0])
  results["inputs"] = dict(
    pretrain=fingerprint.data(flags[first]), finetune=fingerprint.data(flags[tuned])
  )
  for family in FAMILIES:
    for fraction in profile.fractions:
      key = f"{family}/1of{fraction}"
      pre_dir = _pretrain_dir(workdir, family, fraction)
      metrics, _ = common.run_stage(
        f"pretrain {family} on {UPSTREAM} 1/{fraction}",
        pretrain_args(family, fraction, profile),
        pre_dir,
        resume=True,
      )
      flops = _cached(cache, f"{family}/flops_per_step", lambda d=pre_dir: train_step_flops(d))
      run = dict(
        family=family,
        fraction=fraction,
        pretrain_examples=UPSTREAM_TRAIN // fraction,
        pretrain_steps=profile.pretrain_steps,
        pretrain_flops=flops * profile.pretrain_steps,
        upstream_val_accuracy=metrics.get("val/accuracy"),
        pretrain_seconds=metrics.get("wall_seconds"),
      )
      run["fewshot"] = _cached(cache, f"{key}/fewshot", lambda d=pre_dir: fewshot(d))
      if fraction == min(profile.fractions):  # the largest set's intermediate checkpoints
        curve = []
        for step in _checkpoint_steps(pre_dir):
          acc = _cached(
            cache,
            f"{key}/fewshot@{step}",
            lambda d=pre_dir, s=step: fewshot(os.path.join(d, "checkpoints", str(s))),
          )
          curve.append(dict(step=step, flops=flops * step, fewshot=acc))
        run["fewshot_curve"] = curve
      run["finetune"] = {}
      for dataset in profile.finetune_datasets:
        minival, dirs = {}, {}
        for lr in profile.learning_rates:
          dirs[lr] = _finetune_dir(workdir, family, fraction, dataset, lr)
          ft, _ = common.run_stage(
            f"fine-tune {family} 1/{fraction} on {dataset}, lr {lr}",
            finetune_args(family, pre_dir, dataset, lr, profile),
            dirs[lr],
            resume=True,
          )
          minival[lr] = ft["val/accuracy"]
        best = select_learning_rate(minival)
        run["finetune"][dataset] = dict(
          minival={str(k): v for k, v in minival.items()},
          learning_rate=best,
          test_accuracy=_cached(
            cache,
            f"{key}/{dataset}/test@{best}",
            lambda d=dirs[best], ds=dataset: test_accuracy(d, ds, profile),
          ),
        )
      runs[key] = run
      save()

  pixel_results = results.setdefault("baselines", {})
  for dataset in DOWNSTREAM:
    entry = pixel_results.setdefault(dataset, {})
    entry[f"{profile.shots}shot"] = _cached(
      cache,
      f"baseline/{dataset}/{profile.shots}shot",
      lambda d=dataset: baselines.pixel_baselines(d, "train", fewshot.training_rows(d)),
    )
    if dataset in profile.finetune_datasets:
      entry["finetune"] = _cached(
        cache,
        f"baseline/{dataset}/finetune",
        lambda d=dataset: baselines.pixel_baselines(d, FINETUNE_TRAIN),
      )
  # This invocation's: with the stages an earlier one finished, less than the study took.
  results["seconds"] = dict(total=time.perf_counter() - start)
  save()
  return results


def _checkpoint_steps(workdir: str) -> list[int]:
  directory = os.path.join(workdir, "checkpoints")
  return sorted(int(d) for d in os.listdir(directory) if d.isdigit())


# ---------------------------------------------------------------------------------------------
# Table and plots.


def _pct(x: float | None) -> str:
  return "–" if x is None else f"{100 * x:.1f}%"


def _ordered(runs: dict[str, Any]) -> list[dict[str, Any]]:
  """Runs by family (as in FAMILIES), then by growing pretraining set."""
  families = list(FAMILIES)
  return sorted(runs.values(), key=lambda r: (families.index(r["family"]), -r["fraction"]))


def markdown_table(results: dict[str, Any]) -> str:
  """One row per (family, pretraining set, downstream set), with the raw-pixel baselines."""
  shots = results["profile"]["shots"]
  lines = [
    f"| model | pretrain images | pretrain GFLOPs | upstream val | downstream | {shots}-shot linear "
    f"| pixels logreg / kNN-3 ({shots}-shot) | fine-tune (lr) | pixels logreg / kNN-3 (98%) |",
    "|---|---:|---:|---:|---|---:|---:|---:|---:|",
  ]
  for run in _ordered(results["runs"]):
    for dataset in DOWNSTREAM:
      base = results["baselines"][dataset]
      few = base[f"{shots}shot"]
      ft = run["finetune"].get(dataset)
      ft_base = base.get("finetune")
      lines.append(
        f"| {run['family']} | {run['pretrain_examples']:,} | {run['pretrain_flops'] / 1e9:,.0f} "
        f"| {_pct(run['upstream_val_accuracy'])} | {dataset} | {_pct(run['fewshot'][dataset])} "
        f"| {_pct(few['logreg'])} / {_pct(few['knn3'])} "
        f"| {_pct(ft['test_accuracy']) + ' (' + str(ft['learning_rate']) + ')' if ft else '–'} "
        f"| {_pct(ft_base['logreg']) + ' / ' + _pct(ft_base['knn3']) if ft_base else '–'} |"
      )
  return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], out: str) -> list[str]:
  """The paper's two views: transfer accuracy vs pretraining set size, and vs compute."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  shots = results["profile"]["shots"]
  runs = list(results["runs"].values())
  colors = {"ViT": "tab:blue", "BiT": "tab:red"}
  paths = []

  fig, axes = plt.subplots(1, len(DOWNSTREAM), figsize=(5 * len(DOWNSTREAM), 4), squeeze=False)
  for ax, dataset in zip(axes[0], DOWNSTREAM, strict=True):
    for family, color in colors.items():
      mine = sorted((r for r in runs if r["family"] == family), key=lambda r: r["fraction"])[::-1]
      x = [r["pretrain_examples"] for r in mine]
      ax.plot(
        x, [r["fewshot"][dataset] for r in mine], "o-", color=color, label=f"{family} {shots}-shot"
      )
      ft = [r["finetune"].get(dataset) for r in mine]
      if all(ft):
        ax.plot(
          x, [f["test_accuracy"] for f in ft], "s--", color=color, label=f"{family} fine-tune"
        )
    base = results["baselines"][dataset]
    ax.axhline(
      base[f"{shots}shot"]["knn3"], color="gray", ls=":", label=f"pixels kNN-3, {shots}-shot"
    )
    if "finetune" in base:
      ax.axhline(base["finetune"]["knn3"], color="black", ls=":", label="pixels kNN-3, 98% train")
    ax.set_xscale("log")
    ax.set_xlabel("pretraining images (Fashion-MNIST subset)")
    ax.set_ylabel(f"{dataset} top-1")
    ax.set_title(f"transfer to {dataset}")
    ax.legend(fontsize=7)
  fig.tight_layout()
  paths.append(os.path.join(out, "accuracy_vs_data.png"))
  fig.savefig(paths[-1], dpi=120)
  plt.close(fig)

  fig, axes = plt.subplots(1, len(DOWNSTREAM), figsize=(5 * len(DOWNSTREAM), 4), squeeze=False)
  for ax, dataset in zip(axes[0], DOWNSTREAM, strict=True):
    for family, color in colors.items():
      mine = [r for r in runs if r["family"] == family]
      for r in mine:
        curve = r.get("fewshot_curve")
        if curve:
          ax.plot(
            [c["flops"] for c in curve],
            [c["fewshot"][dataset] for c in curve],
            "-",
            color=color,
            alpha=0.6,
            label=f"{family}, largest set, during training",
          )
      ax.scatter(
        [r["pretrain_flops"] for r in mine],
        [r["fewshot"][dataset] for r in mine],
        color=color,
        marker="o",
        label=f"{family}, end of training (each subset)",
      )
    few = results["baselines"][dataset][f"{shots}shot"]
    ax.axhline(few["knn3"], color="gray", ls=":", label=f"pixels kNN-3, {shots}-shot")
    ax.axhline(few["logreg"], color="gray", ls="-.", label=f"pixels logreg, {shots}-shot")
    ax.set_xscale("log")
    ax.set_xlabel("pretraining compute (model FLOPs × steps)")
    ax.set_ylabel(f"{dataset} {shots}-shot linear top-1")
    ax.set_title(f"{dataset}: transfer vs compute")
    ax.legend(fontsize=7)
  fig.tight_layout()
  paths.append(os.path.join(out, "accuracy_vs_compute.png"))
  fig.savefig(paths[-1], dpi=120)
  plt.close(fig)
  return paths


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    workdir=flags.DEFINE_string("workdir", WORKDIR, "Workdirs of the runs.", flag_values=values),
    out=flags.DEFINE_string(
      "out", None, "The results' folder (default: see the module docstring).", flag_values=values
    ),
    quick=flags.DEFINE_bool("quick", False, "Tiny budgets (tests, CI).", flag_values=values),
  )


def main(argv: list[str], f: types.SimpleNamespace) -> dict[str, Any]:
  args = cli.values(f)
  profile = QUICK if args.quick else FULL
  out = common.out_dir(args.out, "scale_study", args.workdir, args.quick)
  start = time.perf_counter()
  started = common.provenance()
  results = run_study(args.workdir, profile)
  if out == common.results_dir("scale_study"):  # the committed results: with the fingerprint
    quick = run_study(os.path.join(args.workdir, "fingerprint"), QUICK)
    fingerprint.attach(results, quick, stage_flags(FULL, WORKDIR))
  common.write_results(os.path.join(out, "results.json"), results, started, sort_keys=True)
  table = markdown_table(results)
  with open(os.path.join(out, "results.md"), "w") as f:
    f.write(table)
  paths = plot(results, out)
  print("\n" + table)
  print(
    f"wrote results.json, results.md, {', '.join(map(os.path.basename, paths))} in "
    f"{out} ({time.perf_counter() - start:.0f}s)"
  )
  return results


if __name__ == "__main__":
  cli.run(main, "experiments.scale_study", define_flags)
