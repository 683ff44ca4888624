"""Issue 19 point 7: report and profile writers stay inside the requested folder, write
atomically (temporary file, then rename) and fail with a clear error on an unwritable path."""

import json
import os

import pytest

from outcore.cli import EXIT_OUTPUT, main
from outcore.errors import OutputPathError
from outcore.report import files


def test_write_is_atomic_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "report.html"
    target.write_text("old report")
    real_replace = os.replace

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OutputPathError, match="No space left"):
        files.write_text(target, "new report")
    assert target.read_text() == "old report"  # never half-written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
    monkeypatch.setattr(os, "replace", real_replace)
    files.write_text(target, "new report")
    assert target.read_text() == "new report"
    assert oct(target.stat().st_mode & 0o777) != oct(0o600)  # what open() would give


def test_a_symlink_at_the_target_is_replaced_not_followed(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "trace.json").symlink_to(outside)
    files.write_text(folder / "trace.json", "{}")
    assert outside.read_text() == "precious"
    assert not (folder / "trace.json").is_symlink()


@pytest.mark.parametrize("name", ["../escape.html", "sub/x.html", "..", "", "/etc/passwd"])
def test_names_cannot_leave_the_folder(tmp_path, name):
    with pytest.raises(OutputPathError, match="plain file name"):
        files.inside(tmp_path, name)


def test_unwritable_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(OutputPathError, match="cannot create the output folder"):
        files.output_folder(blocker / "out")
    with pytest.raises(OutputPathError, match="is a file"):
        files.check_folder(blocker / "out" / "deeper")
    assert files.check_folder(tmp_path / "new" / "folder") == tmp_path / "new" / "folder"
    assert not (tmp_path / "new").exists()  # checking creates nothing
    with pytest.raises(OutputPathError, match="is a folder"):
        files.check_writable(tmp_path)


def test_simulate_into_an_unwritable_path_exits_6_before_capturing(tmp_path, capsys,
                                                                  monkeypatch):
    from outcore import cli_workload

    monkeypatch.setattr(cli_workload, "capture", lambda *a, **k: pytest.fail("captured"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = main(["simulate", "--model", "mlp", "--batch", "8", "--out", str(blocker / "out")])
    err = capsys.readouterr().err
    assert code == EXIT_OUTPUT
    assert "OutputPathError" in err and "a-file" in err and len(err.strip().splitlines()) == 1


def test_simulate_writes_only_inside_its_folder(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--json", "simulate", "--model", "mlp", "--batch", "8", "--budget", "30MB",
                 "--out", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    written = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["memory.png", "memory_snapshot.pickle", "report.html", "trace.json"]
    assert all(str(out) in doc[k] for k in ("plot", "trace", "report", "snapshot"))


def test_profile_out_checks_the_path_before_measuring(tmp_path, capsys, monkeypatch):
    import outcore.cost.measure_host as host

    monkeypatch.setattr(host, "measure_this_cpu", lambda: pytest.fail("measured first"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = main(["profile", "--model", "mlp", "--out", str(blocker / "ops.json")])
    assert code == EXIT_OUTPUT
    assert "OutputPathError" in capsys.readouterr().err
