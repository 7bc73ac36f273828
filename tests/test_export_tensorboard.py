"""gitresearch export --tensorboard: every experiment's curve and results, read back from the
event files with TensorBoard's own reader."""
import pytest

from gitresearch.export import run_curve
from gitresearch.gitstore import Store
from helpers import cli

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def read(folder):
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0,
                                                                         event_accumulator.TENSORS: 0})
    acc.Reload()
    return acc


def test_the_export_round_trips(tmp_path):
    repo = tmp_path / "gym"
    cli("init", "--template", "gym", str(repo), cwd=tmp_path)
    cli("loop", "--policy", "random", "--seed", "5", "--max-experiments", "6", cwd=repo)
    out = tmp_path / "tb"
    for _ in range(2):  # a second export replaces the first
        cli("export", "--tensorboard", str(out), cwd=repo)
    store = Store(repo)
    experiments = list(reversed(store.experiments()))
    runs = sorted(p.name for p in out.iterdir())
    assert runs == sorted([f"{e.number:06d}-{e.record['status']}" for e in experiments] + ["progress"])
    for exp in experiments:
        acc = read(out / f"{exp.number:06d}-{exp.record['status']}")
        text = acc.Tensors("description/text_summary")[0].tensor_proto.string_val[0].decode()
        assert text == f"#{exp.number} {exp.record['status']}: {exp.record.get('description') or exp.description}"
        curve = run_curve(store, exp.number)["metric"]
        if exp.record["status"] in ("crash", "invalid", "timeout"):
            assert "curve/val_bpb" not in acc.Tags()["scalars"] or curve
            continue
        assert curve, exp.number  # the gym writes metric points
        scalars = acc.Scalars("curve/val_bpb")
        assert [s.step for s in scalars] == [p["step"] for p in curve]
        assert [s.value for s in scalars] == pytest.approx([p["value"] for p in curve], rel=1e-6)
        assert [s.wall_time - scalars[0].wall_time for s in scalars] == pytest.approx(
            [p["t"] - curve[0]["t"] for p in curve], abs=1e-3)  # "relative" is seconds of training
        if exp.record.get("val_bpb") is not None:
            assert acc.Scalars("final/val_bpb")[0].value == pytest.approx(exp.record["val_bpb"], rel=1e-6)
        else:  # an early-stopped run has no final
            assert "final/val_bpb" not in acc.Tags()["scalars"]
    assert any(e.record["status"] == "early_stop" for e in experiments)
    progress = read(out / "progress")
    finished = [e for e in experiments if e.record.get("val_bpb") is not None]
    assert [s.step for s in progress.Scalars("progress/val_bpb")] == [e.number for e in finished]
    best = [s.value for s in progress.Scalars("progress/best")]
    assert best == sorted(best, reverse=True) and best[-1] == pytest.approx(store.read_note(store.best())["val_bpb"])
