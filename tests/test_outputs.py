"""Issue 17, item 2: every file mmleak.py, mmleak-panda.py and mmleak-install.py write is a
new file made with O_CREAT|O_EXCL|O_NOFOLLOW under a name nobody can guess, renamed over the
output's name (mmleak.new_output).  A link another user planted at an output's name, or at
the temporary name an older version used, is replaced or left alone, never written through;
a dump file with another name (a hard link) is not rewritten.  Root runs these tests; the
planted links belong to nobody, as a local user's would."""
import os
import stat
import subprocess
import sys

import pytest

from conftest import ROOT, mmleak, run_traced

MMLEAK_PY = [sys.executable, os.path.join(ROOT, "mmleak.py")]
NOBODY = 65534
VICTIM = b"root's file: must not change\n"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants files as another user")


def plant_link(path, target):
    """A symbolic link at PATH to TARGET, owned by nobody."""
    os.symlink(str(target), str(path))
    os.lchown(str(path), NOBODY, NOBODY)


@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim"
    v.write_bytes(VICTIM)
    os.chmod(v, 0o600)
    return v


@pytest.fixture
def trace(bins, dump):
    """A finished trace of `hostile basic` in DUMP: its id."""
    run_traced([bins["hostile"], "basic"], dump)
    (tid,) = [k for k, v in mmleak.find_traces(str(dump)).items() if v]
    return tid


def leftovers(d):
    """Temporary files new_output would have left in D."""
    return sorted(n for n in os.listdir(d) if n.endswith(".tmp") or ".tmp" in n)


def test_report_html_and_csv_are_never_written_through_a_link(trace, dump, victim, tmp_path,
                                                             capsys):
    """The HTML page's old temporary name (DIR/mmleak.ID.html.tmpPID: report runs here, in
    this process), the page's own name and the CSV's are links to root's files: the files
    stay as they were, the outputs are new regular files in their place, and nothing else is
    left in the directory."""
    html = dump / ("mmleak.%s.html" % trace)
    old_tmp = dump / ("mmleak.%s.html.tmp%d" % (trace, os.getpid()))
    csv = dump / "sites.csv"
    others = {p: tmp_path / ("victim-" + p.name) for p in (html, csv)}
    for p, v in others.items():
        v.write_bytes(VICTIM)
        plant_link(p, v)
    plant_link(old_tmp, victim)
    assert mmleak.main(["report", str(dump), "--pid", trace, "--csv", str(csv)]) == 0
    capsys.readouterr()
    for v in [victim] + list(others.values()):
        assert v.read_bytes() == VICTIM, v
    for p in (html, csv):
        st = os.lstat(p)
        assert stat.S_ISREG(st.st_mode) and (st.st_uid, st.st_nlink) == (0, 1), p
    assert html.read_text().startswith("<!DOCTYPE html>")
    assert csv.read_text().startswith("bytes,blocks,mean,min,max,")
    assert os.path.islink(old_tmp)          # not a name of ours any more: left as it was
    assert leftovers(dump) == [old_tmp.name]


def test_shrink_and_snapshot_outputs_replace_a_planted_link(trace, dump, victim, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, 0o1777)                   # a shared directory, as /tmp
    for cmd in (["shrink", "-o", str(out / "shrunk")] + mmleak.find_traces(str(dump))[trace],
                ["snapshot", str(dump), "--pid", trace, "-o", str(out / "snap")]):
        name = out / cmd[cmd.index("-o") + 1].rsplit("/", 1)[1]
        plant_link(name, victim)
        r = subprocess.run(MMLEAK_PY + cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert victim.read_bytes() == VICTIM
        st = os.lstat(name)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0
        assert name.read_bytes().startswith(b"#mmleak 2 id=%s " % trace.encode())
    assert leftovers(out) == []


def test_recover_never_appends_to_a_file_with_another_name(bins, dump, victim):
    """recover appends the lines of its .tail to a dump file (its owner and mode stay as
    they were); a dump file that is a hard link to another file is
    left alone, with one line, exit 2."""
    run_traced([bins["hostile"], "kill"], dump, check=False)
    (out,) = [str(dump / n) for n in os.listdir(dump) if n.endswith(".out")]
    assert os.path.exists(out[:-4] + ".tail")
    os.unlink(out)
    os.link(str(victim), out)               # (fs.protected_hardlinks=0 lets any user do it)
    r = subprocess.run(MMLEAK_PY + ["recover", str(dump)], capture_output=True, text=True)
    assert (r.returncode, r.stdout, r.stderr) == (
        2, "nothing to recover\n",
        "mmleak.py: %s: cannot recover: it has 2 names (hard links): left alone\n" % out)
    assert victim.read_bytes() == VICTIM and os.path.exists(out[:-4] + ".tail")
    # a file of its own: recovered, its owner and mode kept
    os.unlink(out)
    with open(out, "wb") as f:
        f.write(b"")
    os.chown(out, 0, NOBODY)                # the trace's owner (root): another one's file
    os.chmod(out, 0o640)                    # would be ignored (test_dumpdir_readers.py)
    want = mmleak.unflushed_tail(out)
    want = want[:want.rfind(b"\n") + 1]       # what recover appends: its complete lines
    r = subprocess.run(MMLEAK_PY + ["recover", str(dump)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    st = os.lstat(out)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), st.st_nlink) == (0, NOBODY,
                                                                             0o640, 1)
    assert open(out, "rb").read() == want and want.count(b"\n") > 10
    assert not os.path.exists(out[:-4] + ".tail")
    assert victim.read_bytes() == VICTIM and leftovers(dump) == []


def test_devices_and_our_own_descriptors_are_written_as_they_are(trace, dump):
    """-o /dev/null stays the device; --csv /dev/stdout is the command's standard output."""
    r = subprocess.run(MMLEAK_PY + ["snapshot", str(dump), "--pid", trace, "-o", "/dev/null"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)
    r = subprocess.run(MMLEAK_PY + ["report", str(dump), "--pid", trace, "--no-html",
                                    "--csv", "/dev/stdout"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    head = lines.index("bytes,blocks,mean,min,max,oldest_s,youngest_s,function,file,line,"
                       "module,offset,kind,caller")
    assert lines[0].startswith("mmleak: trace %s " % trace) and head > 0
    assert lines[-1] == "CSV: /dev/stdout"
    assert stat.S_ISLNK(os.lstat("/dev/stdout").st_mode)
