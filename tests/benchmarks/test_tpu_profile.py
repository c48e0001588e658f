"""benchmarks/tpu_profile.py: a profiler trace's device ops summed per op and per kind, each op named from
the compiled program's text. The trace is built as XLA's XSpace text proto (jax.profiler.ProfileData
reads it as it reads a TPU's .xplane.pb; a CPU's trace has no device plane), the program text is XLA's
own (a CPU compile of a small function). MaxText is told to trace after its timed steps in a fresh
compile; a stand-in for its trainer (step lines, an HLO dump, a trace, as MaxText writes them) checks
that tpu_maxtext.py times only the timed steps and reads the trace, also when the run is stopped."""

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.profiler import ProfileData

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import tpu_maxtext  # noqa: E402
import tpu_profile  # noqa: E402
import tpu_throughput  # noqa: E402


def _space(ops_plane: str = "/device:TPU:0") -> ProfileData:
    """A host plane, then a device plane whose "XLA Ops" line ran fusion.12 twice (2 us each),
    convolution.3 once (1 us) and custom-call.7 once (3 us); 1 us = 1e6 ps."""
    events = "".join(
        f"events {{ metadata_id: {m} offset_ps: {at} duration_ps: {us * 10**6} }} "
        for m, at, us in ((1, 0, 2), (2, 3_000_000, 1), (3, 5_000_000, 3), (1, 9_000_000, 2))
    )
    names = {1: "fusion.12", 2: "convolution.3", 3: "custom-call.7", 4: "jit_train_step(1)"}
    meta = "".join(f'event_metadata {{ key: {k} value {{ id: {k} name: "{v}" }} }} ' for k, v in names.items())
    return ProfileData.from_text_proto(
        'planes { id: 1 name: "/host:CPU" lines { id: 1 name: "python" } } '
        f'planes {{ id: 2 name: "{ops_plane}" '
        'lines { id: 1 name: "XLA Modules" events { metadata_id: 4 offset_ps: 0 duration_ps: 12000000 } } '
        f'lines {{ id: 2 name: "XLA Ops" {events}}} {meta}}}'
    )


HLO = "\n".join(  # three lines of a TPU step's optimized HLO, in the format XLA prints
    [
        "  %fusion.12 = bf16[8192,4096]{1,0:T(8,128)(2,1)} fusion(bf16[8192,4096]{1,0} %p0, bf16[4096,4096]{1,0} "
        '%p1), kind=kOutput, calls=%fused_computation.12, metadata={op_name="jit(train_step)/jvp(model)/while/'
        'body/dot_general" source_file="x.py" source_line=1}',
        "  %convolution.3 = (f32[4096]{0}, s32[]) convolution(f32[64,64]{1,0} %a, f32[64,64]{1,0} %b), "
        "dim_labels=bf_io->bf",
        "  ROOT %custom-call.7 = f32[8,128]{1,0} custom-call(f32[8,128]{1,0} %x), custom_call_target="
        '"tpu_custom_call", metadata={op_name="jit(train_step)/transpose(jvp(model))/splash_mha_dq/pallas_call"}',
    ]
)


def test_device_time_is_summed_per_op_and_per_kind_per_step():
    prof = tpu_profile.op_times(_space(), steps=2, hlo=tpu_profile.hlo_ops(HLO))
    assert prof["device_plane"] == "/device:TPU:0" and prof["named_ops"] == 1.0
    assert prof["ms_per_step"] == pytest.approx((2 + 1 + 3 + 2) / 1000 / 2)
    # the kind is the JAX op the HLO op came from, else its opcode
    assert prof["by_kind"] == pytest.approx({"dot_general": 0.002, "pallas_call": 0.0015, "convolution": 0.0005})
    assert list(prof["by_kind"]) == ["dot_general", "pallas_call", "convolution"]  # most time first
    assert [(o["op"], o["ms"]) for o in prof["top_ops"]] == [
        ("fusion.12", pytest.approx(0.002)),
        ("custom-call.7", pytest.approx(0.0015)),
        ("convolution.3", pytest.approx(0.0005)),
    ]
    assert prof["top_ops"][1]["what"].endswith("splash_mha_dq/pallas_call")
    # without the program's text each kind is the op's name without its number
    bare = tpu_profile.op_times(_space(), steps=1)
    assert set(bare["by_kind"]) == {"fusion", "convolution", "custom-call"} and bare["named_ops"] == 0.0


def test_a_trace_without_device_ops_is_an_error_that_lists_the_planes():
    with pytest.raises(ValueError, match=r"no device plane .*\(planes: /host:CPU, /host:other\)"):
        tpu_profile.op_times(_space("/host:other"), steps=1)


def test_reading_a_folder_without_a_trace_says_so_instead_of_raising(tmp_path):
    assert tpu_profile.read(tmp_path, steps=1) == {"error": f"no *.xplane.pb under {tmp_path} (was the profiler on?)"}


def test_the_program_text_xla_prints_names_each_op():
    a = jnp.ones((64, 64), jnp.float32)
    compiled = jax.jit(lambda x: jnp.tanh(x @ x).sum()).lower(a).compile()
    ops = tpu_profile.hlo_ops(compiled.as_text())
    assert ops, compiled.as_text()[:2000]
    opcodes = {opcode for opcode, _ in ops.values()}
    assert opcodes & {"dot", "fusion", "custom-call"}, opcodes
    # XLA keeps each op's origin in its metadata: the matmul and the tanh are found by their JAX names
    named = " ".join(op_name for _, op_name in ops.values())
    assert "dot_general" in named or "tanh" in named, named


def test_side_by_side_puts_each_kind_on_one_row_and_the_totals_last():
    a = {"by_kind": {"dot_general": 10.0, "pallas_call": 4.0}, "ms_per_step": 14.0, "named_ops": 1.0}
    b = {"by_kind": {"dot_general": 9.0, "copy": 2.0}, "ms_per_step": 11.0, "named_ops": 0.5}
    lines = tpu_profile.side_by_side({"olmax": a, "MaxText": b}).splitlines()
    assert lines[0].split()[-2:] == ["olmax", "MaxText"]
    assert [line.split() for line in lines[1:]] == [
        ["dot_general", "10.00", "9.00"],
        ["pallas_call", "4.00", "0.00"],
        ["copy", "0.00", "2.00"],
        ["device", "ops", "in", "all", "14.00", "11.00"],
        ["ops", "named", "by", "the", "program", "text", "100%", "50%"],
    ]


def _line(events: list[tuple[str, int, int]]) -> ProfileData:
    """One device plane whose "XLA Ops" line holds events (name, start us, duration us)."""
    names = sorted({n for n, _, _ in events})
    ids = {n: i + 1 for i, n in enumerate(names)}
    body = "".join(
        f"events {{ metadata_id: {ids[n]} offset_ps: {at * 10**6} duration_ps: {us * 10**6} }} " for n, at, us in events
    )
    meta = "".join(f"event_metadata {{ key: {i} value {{ id: {i} name: {json.dumps(n)} }} }} " for n, i in ids.items())
    return ProfileData.from_text_proto(
        f'planes {{ id: 1 name: "/device:TPU:0" lines {{ id: 1 name: "XLA Ops" {body}}} {meta}}}'
    )


def test_a_loop_s_time_is_counted_once_by_the_ops_inside_it():
    # while.1 spans 0-10 us and holds two 4 us fusions; then a 1 us copy after it
    space = _line([("while.1", 0, 10), ("fusion.2", 1, 4), ("fusion.3", 5, 4), ("copy.4", 11, 1)])
    prof = tpu_profile.op_times(space, steps=1)
    assert prof["ms_per_step"] == pytest.approx(0.011)  # 10 + 1 us, not 19
    ops = {o["op"]: o["ms"] for o in prof["top_ops"]}
    assert ops == pytest.approx({"fusion.2": 0.004, "fusion.3": 0.004, "while.1": 0.002, "copy.4": 0.001})
    # nested loops: each level keeps only its own time
    space = _line([("while.1", 0, 10), ("while.2", 1, 6), ("fusion.3", 2, 5)])
    ops = {o["op"]: o["ms"] for o in tpu_profile.op_times(space, steps=1)["top_ops"]}
    assert ops == pytest.approx({"fusion.3": 0.005, "while.1": 0.004, "while.2": 0.001})


def test_an_op_named_by_its_whole_line_is_found_in_the_program_text():
    long = "%fusion.12 = bf16[8192,4096]{1,0} fusion(bf16[8192,4096]{1,0} %p0), kind=kOutput, calls=%f"
    prof = tpu_profile.op_times(_line([(long, 0, 3)]), steps=1, hlo=tpu_profile.hlo_ops(HLO))
    assert prof["named_ops"] == 1.0 and prof["by_kind"] == pytest.approx({"dot_general": 0.003})
    assert prof["top_ops"][0]["op"] == "fusion.12"


def test_maxtext_traces_the_steps_after_its_timed_ones_in_a_fresh_compile():
    timed = 13  # 2 warm-up + 10 timed + 1: the step lines tpu_maxtext.py reads
    extra, total, dump = tpu_maxtext.profile_args(timed, Path("/out"))
    options = dict(a.split("=", 1) for a in extra)
    # MaxText's profiler (common/profiler.py): it starts at step skip and stops after step
    # min(skip + profiler_steps - 1, steps - 1), and refuses a start at or past the last step
    first = int(options["skip_first_n_steps_for_profiler"])
    last = min(first + int(options["profiler_steps"]) - 1, total - 1)
    assert options["profiler"] == "xplane" and first < total
    assert first > timed - 1 and last - first + 1 == tpu_profile.PROFILE_STEPS  # all after the timed steps
    assert options["jax_cache_dir"].startswith("/out/")  # not ~/jax_cache: a cached step is not dumped
    assert "--xla_dump_to=/out/hlo" in dump and "--xla_dump_hlo_as_text" in dump and "train_step" in dump


FAKE_TRAINER = """
import os, sys, time
from pathlib import Path
from jax.profiler import ProfileData

opts = dict(a.split("=", 1) for a in sys.argv[2:] if "=" in a)
for k in range(int(opts["steps"])):  # a step every 0.4 s, as MaxText's metric logger prints it
    s = 27.5 + 0.4 * k
    print(f"I1205 22:31:{s:09.6f} 1 metric_logger.py:230] completed step: {k}, seconds: 0.400, "
          "TFLOP/s/device: 65.000, Tokens/s/device: 1.0", flush=True)
flags = dict(f.split("=", 1) for f in os.environ["XLA_FLAGS"].split() if "=" in f)
dump = Path(flags["--xla_dump_to"])
dump.mkdir(parents=True)
(dump / "module_0042.jit_train_step.cl_1.after_optimizations.txt").write_text(os.environ["FAKE_HLO"])
trace = Path(opts["base_output_directory"]) / opts["run_name"] / "tensorboard/plugins/profile/1/h.xplane.pb"
trace.parent.mkdir(parents=True)
trace.write_bytes(ProfileData.text_proto_to_serialized_xspace(os.environ["FAKE_TRACE"]))
if os.environ.get("FAKE_HANG"):
    time.sleep(60)
"""


def _fake_maxtext(tmp_path, monkeypatch, hang: bool):
    trainer = tmp_path / "src" / "maxtext" / "trainers" / "pre_train"
    trainer.mkdir(parents=True)
    for d in (trainer.parents[1], trainer.parent, trainer):
        (d / "__init__.py").write_text("")
    (trainer / "train.py").write_text(FAKE_TRAINER)
    events = "events { metadata_id: 1 offset_ps: 0 duration_ps: 6000000 }"
    monkeypatch.setenv("FAKE_HLO", HLO)
    monkeypatch.setenv(
        "FAKE_TRACE",
        f'planes {{ id: 1 name: "/device:TPU:0" lines {{ id: 1 name: "XLA Ops" {events} }} '
        'event_metadata { key: 1 value { id: 1 name: "fusion.12" } } }',
    )
    if hang:
        monkeypatch.setenv("FAKE_HANG", "1")
    row = {"row": "7b-layers", "n_layers": 1, "param_dtype": "bfloat16", "remat": "full", "micro_batch": 1}
    args = argparse.Namespace(
        maxtext_src=str(tmp_path / "src"),
        maxtext_python=sys.executable,
        warmup=2,
        steps=10,
        json=None,
        smoke=False,
        profile=True,
        row_timeout=10 if hang else 120,
    )
    return tpu_maxtext.run_maxtext({**row, "accum_steps": 1}, {"smoke": False, "set": []}, args)


def test_a_profiled_maxtext_run_is_timed_on_its_timed_steps_and_its_trace_read(tmp_path, monkeypatch):
    r = _fake_maxtext(tmp_path, monkeypatch, hang=False)
    assert "error" not in r, r.get("error")
    assert "steps=17" in r["argv"] and "profiler=xplane" in r["argv"]
    assert r["s_per_step"] == pytest.approx(0.4) and len(r["step_times_s"]) == 10  # the 4 later steps left out
    prof = r["profile"]
    assert prof["named_ops"] == 1.0 and prof["by_kind"] == pytest.approx({"dot_general": 6e-3 / 3})


@pytest.mark.slow  # waits out a 10 s bound
def test_a_maxtext_run_stopped_while_profiling_keeps_its_timing(tmp_path, monkeypatch):
    r = _fake_maxtext(tmp_path, monkeypatch, hang=True)  # every step logged, then killed at the bound
    assert r["s_per_step"] == pytest.approx(0.4)
    assert r["profile"]["by_kind"] == pytest.approx({"dot_general": 6e-3 / 3})


@pytest.mark.slow  # a whole smoke row (compiles, steps): 8-18 s
def test_a_profiled_row_keeps_its_timing_when_the_trace_has_no_device_ops(tmp_path):
    out = tmp_path / "rows.json"
    argv = ["--smoke", "--only", "190m", "--profile", str(tmp_path / "trace"), "--json", str(out)]
    assert tpu_throughput.main(argv) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["s_per_step"] > 0 and len(row["step_times_s"]) == 2
    # the CPU's trace was written but holds no device plane: said, with the planes it has
    assert list((tmp_path / "trace" / "190m").rglob("*.xplane.pb"))
    assert row["profile"]["error"].startswith("no device plane with an 'XLA Ops' line")
