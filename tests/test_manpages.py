"""The manual pages (`make man`, docs/man.py) and the names of the installed commands.

One text for the README, the pages and --help: the option table of docs/environment.rst is
facts.rst_options' output (mmleaklib/facts.py, the rows `mmleak.py options` prints), and the
page is built with a fresh copy of it; each command's page names every subcommand and option
its --help has; the pages and --help of an installed command say `mmleak`, not
`mmleak.py` (mmleaklib/layout.py); and man(1) reads every page without a warning (what
lintian's manual-page check runs)."""
import argparse
import importlib
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import ROOT

sys.path.insert(0, ROOT)
from mmleaklib import facts, layout  # noqa: E402

# the pages every install has: one per command, the dump format, the environment
PAGES = {"mmleak.1": "docs/mmleak.rst", "mmleak-panda.1": "docs/mmleak-panda.rst",
         "mmleak-install.8": "docs/mmleak-install.rst", "mmleak-format.5": "docs/format.rst",
         "mmleak-env.7": "docs/environment.rst"}


def read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="module")
def man(tmp_path_factory):
    """`make man` into a scratch build directory: {page name: roff text}."""
    pytest.importorskip("docutils", reason="python3-docutils not installed (.ci/run does)")
    b = tmp_path_factory.mktemp("build")
    r = subprocess.run(["make", "-s", "-C", ROOT, "man", "B=%s" % b], capture_output=True,
                       text=True, env=dict(os.environ, SOURCE_DATE_EPOCH="1700000000"))
    assert r.returncode == 0, r.stderr
    out = {}
    for n in os.listdir(b / "man"):
        if not n.startswith("."):
            out[n] = (b / "man" / n).read_text()
    return out


def test_option_table_of_the_environment_page_is_generated_from_facts():
    text = read("docs/environment.rst")
    a = text.index(facts.RST_BEGIN)
    b = text.index(facts.RST_END) + len(facts.RST_END)
    assert text[a:b] == facts.rst_options(), \
        "docs/environment.rst's table differs from python3 -m mmleaklib.facts --rst-options"
    # and the generator reads the rows it is given: a changed help text changes the table
    o = facts.OPTIONS[0]
    saved = facts.OPTIONS
    try:
        facts.OPTIONS = (o._replace(help="changed words"),) + saved[1:]
        assert "changed words" in facts.rst_options()
        assert "changed words" in facts.with_rst_options(text)
    finally:
        facts.OPTIONS = saved


def test_make_man_builds_every_page_man_reads_without_a_warning(man):
    for name, src in PAGES.items():
        assert name in man, (name, sorted(man))
        page, section = name.rsplit(".", 1)
        assert re.search(r'^\.TH "%s" %s "2023-11-14" "mmleak %s" "mmleak"$'
                         % (re.escape(page.upper()), section, re.escape(facts.VERSION)),
                         man[name], re.M), name
    # the developers' pages stay out; every installed page has a source in docs/
    assert "mmleak-architecture.7" not in man and "mmleak-testing.7" not in man
    assert len(man) >= 12, sorted(man)
    if not shutil.which("man"):
        pytest.skip("man-db not installed")
    for name, roff in man.items():
        # lintian's check: man --warnings on the page, any output on stderr is a finding
        r = subprocess.run(["man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", "-"],
                           input=roff, capture_output=True, text=True,
                           env=dict(os.environ, LC_ALL="C.UTF-8", MANROFFSEQ="",
                                    MANWIDTH="80"))
        assert (r.returncode, r.stderr) == (0, ""), name


def test_env_page_has_the_fresh_table(man):
    page = man["mmleak-env.7"]
    for o in facts.OPTIONS:
        assert o.env in page
    # roff's escapes back to text: \- a hyphen, \(aq an apostrophe, fonts and \& nothing
    flat = re.sub(r"\\(?:f[BIRP]|&)", "", page).replace("\\(aq", "'")
    flat = " ".join(re.sub(r"\\-", "-", flat).split())
    for o in facts.OPTIONS:
        # the meaning, as the page's table says it (installed names: mmleak, not mmleak.py)
        words = layout.installed_names(o.help).split()
        assert " ".join(words[:6]) in flat, o.env


def subcommands_and_options(parser):
    """{subcommand or '': [option strings]} of an argparse parser."""
    out = {"": []}
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                out[name] = [s for x in sub._actions for s in x.option_strings
                             if s not in ("-h", "--help")]
        else:
            out[""] += [s for s in a.option_strings if s not in ("-h", "--help")]
    return out


def section(text, head, underline):
    """The part of TEXT under the heading HEAD (underlined with UNDERLINE), to the next
    heading of that level."""
    m = re.search(r"^%s\n%s+\n" % (re.escape(head), re.escape(underline)), text, re.M)
    assert m, head
    rest = text[m.end():]
    nxt = re.search(r"^\S[^\n]*\n%s{3,}\n" % re.escape(underline), rest, re.M)
    return rest[:nxt.start()] if nxt else rest


def parsers():
    from mmleaklib import cli
    return (("mmleak.py", cli.build_parser(), "docs/mmleak.rst"),
            ("mmleak-panda.py", importlib.import_module("mmleak-panda").build_parser(),
             "docs/mmleak-panda.rst"),
            ("mmleak-install.py", importlib.import_module("mmleak-install").build_parser(),
             "docs/mmleak-install.rst"))


def test_each_command_page_answers_what_its_help_answers():
    """Every subcommand of a command has its section on the page and every option of it is
    named there; the page has examples that run the command."""
    for script, parser, page in parsers():
        text = read(page)
        opts = subcommands_and_options(parser)
        for sub, strings in opts.items():
            if sub and script == "mmleak.py":
                part = section(section(text, "COMMANDS", "="), sub, "-")
            else:
                part = text
            missing = [s for s in strings if not re.search(r"(?<![\w-])%s(?![\w-])"
                                                           % re.escape(s), part)]
            assert not missing, "%s: %s %s: not on the page: %s" % (page, script, sub, missing)
        examples = section(text, "EXAMPLES", "=")
        assert re.search(r"^   .*(?<![\w/.-])%s " % re.escape(script), examples, re.M), \
            "%s: no example runs %s" % (page, script)
        usage = parser.format_help()
        for sub in opts:
            if sub:
                assert sub in usage


def test_pages_name_the_installed_commands(man):
    """The pages say `mmleak report`, as installed; a path to a script stays one."""
    page = man["mmleak.1"]
    assert re.search(r"\\fBmmleak run\\fP", page)
    for name in ("mmleak.1", "mmleak-panda.1", "mmleak-install.8", "mmleak-env.7", "mmleak-format.5"):
        flat = man[name].replace(r"\&.", ".").replace(r"\-", "-")
        assert not re.search(r"(?<![\w/.-])mmleak(?:-panda|-install)?\.py\b", flat), name
    assert layout.installed_names("run ``mmleak.py report``, mmleak-panda.py and "
                                  "mmleak-install.py's; /usr/local/lib/mmleak/mmleak.py "
                                  "./mmleak.py") == (
        "run ``mmleak report``, mmleak-panda and mmleak-install's; "
        "/usr/local/lib/mmleak/mmleak.py ./mmleak.py")


def test_columns_stay_where_they_were_after_a_shorter_name():
    sys.path.insert(0, os.path.join(ROOT, "docs"))
    man_py = importlib.import_module("man")
    line = "``mmleak.py shrink FILES`` (C)                  0.56 s     18.0 million  39 MB\n"
    out = man_py.aligned_names(line)
    assert out.startswith("``mmleak shrink FILES`` (C)  ")
    assert out.index("0.56 s") == line.index("0.56 s")
    assert out.index("39 MB") == line.index("39 MB")
    assert man_py.aligned_names("plain mmleak.py text\n") == "plain mmleak text\n"


@pytest.mark.parametrize("script,command", sorted(layout.COMMANDS.items()))
def test_installed_command_names_itself_without_py(tmp_path, script, command):
    """Run through a link named as installed, a command's --help and messages say its
    installed name, and the other commands' too; run as the script, the script's."""
    link = tmp_path / command
    link.symlink_to(os.path.join(ROOT, script))
    r = subprocess.run([str(link), "--help"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: %s " % command), r.stdout[:200]
    flat = r.stdout
    assert not re.search(r"(?<![\w/.-])mmleak(?:-panda|-install)?\.py\b", flat), flat
    r = subprocess.run([str(link), "--no-such-option"], capture_output=True, text=True)
    assert r.returncode == 1
    assert re.search(r"^%s: " % re.escape(command), r.stderr, re.M), r.stderr
    r = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("usage: %s " % script), r.stdout[:200]


def exit_items(page):
    """{status: text} of the EXIT STATUS section of PAGE (a definition list), plain."""
    part = section(read(page), "EXIT STATUS", "=")
    items = {}
    for m in re.finditer(r"^(\d)\n((?:   .*\n)+)", part, re.M):
        items[int(m.group(1))] = " ".join(re.sub(r"``([^`]*)``", r"\1", m.group(2)).split())
    return items


@pytest.mark.parametrize("script,page", [("mmleak.py", "docs/mmleak.rst"),
                                         ("mmleak-panda.py", "docs/mmleak-panda.rst"),
                                         ("mmleak-install.py", "docs/mmleak-install.rst")])
def test_exit_statuses_of_help_and_page_agree(script, page):
    """The exit statuses --help prints (mmleaklib/errors.py, one list for the three tools)
    are the page's: each status is there, and says what --help says first."""
    from mmleaklib import errors
    items = exit_items(page)
    assert sorted(items) == [s for s, _ in errors.STATUSES], page
    for status, texts in errors.STATUSES:
        help_text = " ".join(re.sub(r'"', "", texts[script]).split())
        head = re.split(r"[(:,;]", help_text)[0].strip()
        assert items[status].startswith(head), (page, status, head, items[status][:80])


def option_definitions(text):
    """{option: its definition, one line} of the option lists in TEXT (an option at the
    start of a line, its text indented below it)."""
    out = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"(-[a-z]|--[a-z][\w-]*)(?:, (--[a-z][\w-]*))?(?: [A-Z]+| *$|  )", line)
        if not m:
            continue
        body = [line]
        for nxt in lines[i + 1:]:
            if not nxt.startswith(" ") or not nxt.strip():
                break
            body.append(nxt)
        for opt in m.groups():
            if opt:
                out[opt] = " ".join(" ".join(body).split())
    return out


def page_parts(script, parser, text):
    """[(subcommand, its synopsis lines, its option definitions, {option: argparse action})]:
    one per subcommand of mmleak.py (its section of COMMANDS), one for the other pages (their
    OPTIONS, every subcommand's options)."""
    def actions(p):
        return {s: a for a in p._actions for s in a.option_strings if s not in ("-h", "--help")}
    subs = next((dict(a.choices) for a in parser._actions
                 if isinstance(a, argparse._SubParsersAction)), {})
    synopsis = [line for line in section(text, "SYNOPSIS", "=").splitlines()
                if line.startswith("|")]
    if script != "mmleak.py":
        acts = actions(parser)
        for sub in subs.values():
            acts.update(actions(sub))
        return [("", synopsis, option_definitions(section(text, "OPTIONS", "=")), acts)]
    commands = section(text, "COMMANDS", "=")
    return [(name, [line for line in synopsis
                    if re.match(r"\| ``%s %s\b" % (re.escape(script), name), line)],
             option_definitions(section(commands, name, "-")), actions(sub))
            for name, sub in subs.items()]


def test_pages_name_only_the_options_the_commands_have_with_their_defaults():
    """The other way from test_each_command_page_answers_what_its_help_answers: an option in a
    page's SYNOPSIS or option list is one its command (mmleak.py: that subcommand) has; each
    mmleak.py subcommand's SYNOPSIS line names every option it has; and an option's
    definition says the default its --help says (a number)."""
    for script, parser, page in parsers():
        text = read(page)
        for sub, synopsis, defs, acts in page_parts(script, parser, text):
            literals = " ".join(re.findall(r"``([^`]*)``", " ".join(synopsis)))
            named = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", literals))
            extra = sorted((named | set(defs)) - set(acts) - {"-h", "--help", "--version"})
            assert not extra, "%s: %s %s: not options of the command: %s" % (
                page, script, sub, extra)
            if script == "mmleak.py":
                assert len(synopsis) == 1, (page, sub, synopsis)
                missing = sorted(o for o, a in acts.items()
                                 if not set(a.option_strings) & named)
                assert not missing, "%s: SYNOPSIS of %s: missing %s" % (page, sub, missing)
            for opt, a in acts.items():
                if opt != a.option_strings[-1] or opt not in defs:
                    continue
                if re.search(r"\bas ``\w+``'s\b", defs[opt]):
                    continue                    # "as report's": said once, there
                if isinstance(a.default, (int, float)) and not isinstance(a.default, bool):
                    want = "%g" % a.default
                else:
                    m = re.search(r"\bdefault:? (\d+)\b", a.help or "")
                    if not m:
                        continue
                    want = m.group(1)
                assert re.search(r"\bdefault:? (?:``)?%s\b" % re.escape(want), defs[opt]), \
                    "%s: %s %s %s: --help's default is %s: %s" % (page, script, sub, opt,
                                                                 want, defs[opt])


@pytest.mark.parametrize("script,page", [("mmleak.py", "docs/mmleak.rst"),
                                         ("mmleak-panda.py", "docs/mmleak-panda.rst"),
                                         ("mmleak-install.py", "docs/mmleak-install.rst")])
def test_interrupted_is_one_line_and_status_130_as_documented(script, page, tmp_path):
    """Ctrl-C (SIGINT) on a tool waiting for its input: the one line and the status 130 that
    --help and the page say (the status was in neither)."""
    import signal
    from mmleaklib import errors
    argv = {"mmleak.py": ["shrink"], "mmleak-panda.py": [],
            "mmleak-install.py": ["--root", str(tmp_path), "--dry-run", "status", "x.service"]}
    label = "error: " if script == "mmleak-install.py" else ""
    r = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"],
                       capture_output=True, text=True)
    assert " ".join(errors.INTERRUPTED_NOTE.split()) in " ".join(r.stdout.split())
    flat = " ".join(re.sub(r"``", "", section(read(page), "EXIT STATUS", "=")).split())
    assert "Interrupted (SIGINT, Ctrl-C): one line, %s: %sinterrupted, status 130" % (
        script, label) in flat, page
    if script == "mmleak-install.py":
        return              # nothing of it waits for input: the status is run_main's, as above
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, script)] + argv[script],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    p.stdin.write("#mmleak 2 id=1 pid=1 tid=1 file=0 depth=1 start=0\n")
    p.stdin.flush()
    # wait until it blocks reading stdin (read(0, ...), /proc/PID/syscall): a signal during
    # Python's start-up and imports is the interpreter's, before the tool runs
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with open("/proc/%d/syscall" % p.pid) as f:
            if f.read().startswith("0 0x0 "):
                break
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert (p.returncode, err) == (errors.EXIT_INTERRUPTED, "%s: interrupted\n" % script)
