"""The documentation matches the code and holds together: README.rst (the user's guide) and
every page under docs/ (the reference, written to become manual pages) render without a
warning, as HTML and through docutils' manual-page writer (what rst2man runs); the README
stays a guide (600 lines at most); no page names a developer's checkout; every link between
pages resolves; every environment variable the tracer or the scripts read is in the table of
docs/environment.rst (and nothing else is), with the defaults and ranges of the code; and the
README's first commands install what CI installs."""
import glob
import io
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

DOCS = os.path.join(ROOT, "docs")
README = "README.rst"


def read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def doc_pages():
    """docs/*.rst, relative to the source tree."""
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(DOCS, "*.rst")))


def all_pages():
    return [README] + doc_pages()


def docutils_core():
    return pytest.importorskip("docutils.core",
                               reason="python3-docutils not installed (.ci/run installs it)")


def render(name, writer):
    """Render NAME with WRITER; return what docutils reported (INFO and above)."""
    core = docutils_core()
    err = io.StringIO()
    core.publish_string(read(name), source_path=name, writer_name=writer,
                        settings_overrides={"warning_stream": err, "report_level": 1,
                                            "halt_level": 5})
    return err.getvalue()


def test_there_are_reference_pages():
    # the checks below run over these: an empty list would make them pass vacuously
    assert len(doc_pages()) >= 10, doc_pages()


@pytest.mark.parametrize("name", all_pages() + ["bench/README.rst"])
def test_rst_renders_cleanly(name):
    # report_level 1: not even an INFO (a duplicate target, an unused one) is accepted;
    # an unknown `target`_ is an ERROR here, so every link inside a page resolves
    assert render(name, "html") == ""


@pytest.mark.parametrize("name", doc_pages())
def test_page_converts_to_a_man_page(name):
    """What rst2man does: the manual-page writer, with no warning (it has none for images,
    so the pictures stay in README.rst), and a page with a name, a section and a NAME line."""
    assert render(name, "manpage") == ""
    core = docutils_core()
    out = core.publish_string(read(name), source_path=name, writer_name="manpage").decode()
    th = re.search(r'^\.TH "([^"]+)" (\d)', out, re.M)
    assert th, "%s: no .TH line (a :Manual section: field under the title)" % name
    assert re.search(r"^\.SH NAME\n\S+ \\- \S", out, re.M), \
        "%s: no NAME line (a title and a subtitle)" % name
    assert "SEE ALSO" in out, "%s: no SEE ALSO section" % name


def man_names():
    """{'mmleak-format(5)': 'docs/format.rst', ...}: each page's title and manual section."""
    names = {}
    for name in doc_pages():
        text = read(name)
        title = re.match(r"=+\n(\S+)\n=+\n", text)
        section = re.search(r"^:Manual section: (\d)$", text, re.M)
        assert title and section, "%s: no title or no :Manual section:" % name
        names["%s(%s)" % (title.group(1), section.group(1))] = name
    return names


def test_command_pages_have_the_sections_of_a_man_page():
    for ref, name in man_names().items():
        if ref.endswith(("(1)", "(8)")):
            heads = re.findall(r"^([A-Z][A-Z ]+)\n=+$", read(name), re.M)
            for need in ("SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "EXAMPLES",
                         "SEE ALSO"):
                if need == "OPTIONS" and ref == "mmleak(1)":
                    continue        # its options are under each command, in COMMANDS
                assert need in heads, "%s: no %s section" % (name, need)


def test_links_between_pages_resolve():
    """Pages refer to each other as manual pages (mmleak-format(5)), since rst2man has no
    Sphinx :doc: role; the README also names files (docs/format.rst, bench/README.rst) and
    pictures. Every such reference must name a page or file that exists."""
    names = man_names()
    bad = []
    for page in all_pages():
        text = read(page)
        for ref in set(re.findall(r"\b(mmleak(?:-[a-z]+)*\(\d\))", text)):
            if ref not in names:
                bad.append("%s: %s (no page has that name and section)" % (page, ref))
        for path in set(re.findall(r"\b((?:docs|bench)/[\w.-]+\.(?:rst|png))\b", text)):
            if not os.path.exists(os.path.join(ROOT, path)):
                bad.append("%s: %s does not exist" % (page, path))
        for img in re.findall(r"^\.\. image:: (\S+)", text, re.M):
            if not os.path.exists(os.path.join(ROOT, os.path.dirname(page), img)):
                bad.append("%s: image %s does not exist" % (page, img))
    assert not bad, "\n".join(bad)
    # and every reference page is reachable from the README
    readme = read(README)
    assert not [p for p in doc_pages() if p not in readme], "pages the README does not list"


def test_files_the_docs_name_exist():
    """A source file, test or benchmark the docs name exists: README.rst, every page of docs/
    and bench/README.rst, wherever the name stands (in ``literal`` or in prose), so that a file
    that moves or goes (mmleak-unwind.c, mmleak.h...) cannot stay named. When the code moves,
    this test says which names to correct. bench/README.rst also names its own files bare
    (``alloc_bench.c``): those are looked for in bench/ as well."""
    bad = []
    for page in all_pages() + ["bench/README.rst"]:
        text = read(page)
        names = set(re.findall(r"(?<![\w/.-])((?:tests|bench|tracer|tools|mmleaklib|docs)/"
                               r"[\w./-]*[\w-]\.(?:c|h|cpp|py|rst|def|png))\b", text))
        names |= set(re.findall(r"(?<![\w/.-])(mmleak[\w-]*(?:\.[\w-]+)*\.(?:c|h|py))\b", text))
        # a test file the docs name is one of ours, unless a user's example gives it to pytest
        names |= {"tests/" + m.group(1)
                  for m in re.finditer(r"(?<![\w/.-])(test_\w+\.py)\b", text)
                  if "pytest" not in text[text.rfind("\n", 0, m.start()):m.start()]}
        here = "bench" if page == "bench/README.rst" else ""
        for n in sorted(names):
            if not (os.path.exists(os.path.join(ROOT, n))
                    or here and "/" not in n and os.path.exists(os.path.join(ROOT, here, n))
                    or n.endswith(".h") and os.path.exists(os.path.join(ROOT, "include", n))):
                bad.append("%s: %s" % (page, n))
        if here:
            for n in re.findall(r"``(\w+\.(?:c|py))``", text):
                if not (os.path.exists(os.path.join(ROOT, here, n))
                        or os.path.exists(os.path.join(ROOT, n))):
                    bad.append("%s: %s" % (page, n))
    assert not bad, "files named in the docs that are not in the tree:\n" + "\n".join(bad)


def test_the_architecture_page_names_every_source_file():
    """docs/architecture.rst maps each file to what it owns: every file of tracer/, tools/ and
    mmleaklib/, and the three commands, is named there with its path (the other direction,
    every name there is a file, is test_files_the_docs_name_exist)."""
    text = read("docs/architecture.rst")
    sources = ["mmleak.c", "mmleak.py", "mmleak-panda.py", "mmleak-install.py"]
    for d in ("tracer", "tools", "mmleaklib"):
        sources += ["%s/%s" % (d, n) for n in sorted(os.listdir(os.path.join(ROOT, d)))
                    if re.search(r"\.(?:c|h|def|py)$", n)]
    missing = [n for n in sources if "``%s``" % n not in text]
    assert not missing, "files docs/architecture.rst does not describe: %s" % missing


def test_readme_is_a_guide():
    n = read(README).count("\n")
    assert n <= 600, "README.rst has %d lines: move reference text to docs/" % n


def forbidden_paths():
    """Patterns of a machine's own paths: home and work directories, and the directory this
    checkout is in (unless that is a scratch directory the docs use for examples)."""
    pats = [r"/home/[a-z]", r"/Users/\w", r"/root/\w", r"/work/\w"]
    parent = os.path.dirname(os.path.realpath(ROOT))
    if parent.count("/") >= 2 and not parent.startswith(("/tmp/", "/var/tmp/")):
        pats.append(re.escape(parent + "/"))
    return pats


@pytest.mark.parametrize("name", all_pages() + ["bench/README.rst"])
def test_no_absolute_path_of_a_machine(name):
    text = read(name)
    found = [m.group(0) for p in forbidden_paths() for m in re.finditer(p, text)]
    assert not found, "%s names a machine's paths: %s" % (name, found[:5])


def env_table():
    """{variable: (default, range)} from the table of docs/environment.rst."""
    text = read("docs/environment.rst")
    table = text[text.index("VARIABLES\n"):text.index("\nSEE ALSO")]
    rows, cur = {}, None
    border = next(l for l in table.splitlines() if re.fullmatch(r"=+( +=+)+", l))
    a, b = [m.start() for m in re.finditer(r"=+", border)][2:4]     # the range column
    for line in table.splitlines():
        m = re.match(r"``(MMLEAK_[A-Z_]+)``\s+(\S+)\s+(.*?)\s{2,}", line)
        if m:
            cur = m.group(1)
            rows[cur] = [m.group(2).strip("`"), m.group(3).strip()]
        elif cur and not line[:a].strip() and line[a:b].strip():
            rows[cur][1] += " " + line[a:b].strip()     # a range continued below
        elif not line.strip() or line.startswith("="):
            cur = None
    return rows


def test_every_environment_variable_is_documented():
    sources = []
    for pat in ("*.c", "*.h", "*.py", "tracer/*.c", "tracer/*.h", "tracer/*.def", "tools/*.c",
                "mmleaklib/*.py", "build/gen/*.h"):
        sources += glob.glob(os.path.join(ROOT, pat))
    used = set()
    for path in sources:
        with open(path, errors="replace") as f:
            text = f.read()
        used |= set(re.findall(r'"(MMLEAK_[A-Z_]+)"', text))
        if "SHRINK_ENV" in text:
            used.add("MMLEAK_SHRINK")
    assert "MMLEAK_DIR" in used and "MMLEAK_DEPTH" in used, sources   # the scan found them
    documented = set(env_table())
    assert used == documented


def c_int(expr, macros):
    """The value of a C integer expression of numbers, macros and <<."""
    expr = re.sub(r"\b[A-Z_][A-Z0-9_]*\b", lambda m: str(macros.get(m.group(0), m.group(0))),
                  expr.strip())
    assert re.fullmatch(r"[\d\s<()+*-]+", expr), "cannot evaluate %r" % expr
    return eval(expr)       # digits and operators only, checked above


def c_options():
    """{variable: (default, min, max)} as the tracer reads them: the rows X(NAME, "MMLEAK_NAME",
    type, def, min, max, "help") of the option table (build/gen/facts.h, made from
    mmleaklib/facts.py; tracer/options.c reads it), or env_num("NAME", def, lo, hi) calls (the
    tracer before issue 18)."""
    text = ""
    for pat in ("*.c", "*.h", "tracer/*.c", "tracer/*.h", "tracer/*.def", "build/gen/*.h"):
        for path in glob.glob(os.path.join(ROOT, pat)):
            with open(path, errors="replace") as f:
                text += f.read() + "\n"
    macros = {m.group(1): c_int(m.group(2), {})
              for m in re.finditer(r"^#define\s+(\w+)\s+(\d+)\s*$", text, re.M)}
    opts = {}
    for m in re.finditer(r'env_num\("(MMLEAK_\w+)",\s*([^,]+),\s*([^,]+),\s*([^)]+)\)', text):
        opts[m.group(1)] = tuple(c_int(g, macros) for g in m.groups()[1:])
    for m in re.finditer(r'X\(\s*\w+,\s*"(MMLEAK_\w+)",\s*\w+,\s*([^,]+),\s*([^,]+),'
                         r'\s*([^,]+),', text):
        default, lo, hi = m.groups()[1:]
        try:
            # the depth's default is the string "auto", which the table below writes as 0
            opts[m.group(1)] = (0 if default.strip() == '"auto"' else c_int(default, macros),
                                c_int(lo, macros), c_int(hi, macros))
        except AssertionError:
            pass            # a path's default (MMLEAK_DIR)
    return opts


def test_environment_defaults_and_ranges_are_the_code_s():
    table, code = env_table(), c_options()
    checked = 0
    for name, (default, rng) in table.items():
        m = re.fullmatch(r"(?:``auto``, )?(\d+) (?:to|or) (\d+)", rng)
        if not m:
            continue        # a path, or a value of the scripts
        assert name in code, "%s: documented with a range, not found in the tracer's code" % name
        d, lo, hi = code[name]
        assert (lo, hi) == (int(m.group(1)), int(m.group(2))), name
        assert (default == "auto" and d == 0) or default == str(d), (name, default, d)
        checked += 1
    assert checked >= 5, "the numeric options were not found in the table"


def test_first_commands_install_what_ci_installs():
    """The README's first commands work on a fresh machine as written: apt-get update first,
    the packages .ci/run installs, without recommends (systemd-container recommends
    libnss-mymachines, which edits /etc/nsswitch.conf)."""
    readme = read(README)
    first = readme[readme.index("First commands\n"):readme.index("make demo\n---")]
    block = re.search(r"::\n\n((?:   .*\n|\n)+)", first).group(1)
    cmds = re.sub(r"\\\n\s*", " ", block).split("\n")
    cmds = [c.strip() for c in cmds if c.strip()]
    assert cmds[0] == "apt-get update", cmds
    assert cmds[1].startswith("apt-get install -y --no-install-recommends "), cmds
    pkgs = set(cmds[1].split()[4:])
    ci = read(".ci/run")
    loop = re.search(r"for p in (.*?); do", ci, re.S).group(1)
    ci_pkgs = set(loop.replace("\\\n", " ").split())
    assert pkgs == ci_pkgs
    assert "--no-install-recommends" in ci


def plain(text):
    """RST text as the option table words it: no literal or link markup, one space."""
    text = re.sub(r"``([^`]*)``", r"\1", text)
    text = re.sub(r"`([^`<]*?)(?: <[^>]*>)?`_", r"\1", text)
    return " ".join(text.split())


def docs_options():
    """The table of environment variables in docs/environment.rst: [(variable, default,
    meaning)]."""
    text = read("docs/environment.rst")
    lines = text[text.index("VARIABLES\n"):text.index("\nSEE ALSO")].splitlines()
    rules = [i for i, l in enumerate(lines) if re.fullmatch(r"=+( +=+)+", l)]
    cols = [m.start() for m in re.finditer(r"=+", lines[rules[0]])]
    rows = []
    for line in lines[rules[1] + 1:rules[2]]:
        cells = [line[a:b].strip() for a, b in zip(cols, cols[1:] + [None])]
        if cells[0]:
            rows.append(cells)
        else:
            rows[-1] = [(old + " " + new).strip() for old, new in zip(rows[-1], cells)]
    return [(plain(v), plain(d), plain(m)) for v, d, _range, m in rows]


def test_option_table_readme_and_help_agree():
    """One table of the MMLEAK_* variables (mmleaklib/facts.py): docs/environment.rst's table says the
    same (name, default, meaning), `mmleak.py options` prints it, and the C header is made
    from it (one row per setting of mmleak.so and of mmleak-scan)."""
    from mmleaklib import facts
    want = [(o.env, facts.option_default_text(o), o.help) for o in facts.OPTIONS]
    assert docs_options() == want
    r = subprocess.run([sys.executable, os.path.join(ROOT, "mmleak.py"), "options"],
                       capture_output=True, text=True)
    assert (r.returncode, r.stderr) == (0, "")
    printed = " ".join(r.stdout.split())
    for env, default, meaning in want:
        who = facts.OPTION[env].who
        assert " %s %s %s (%s) " % (env, default, meaning, who) in " %s " % printed, env
    r = subprocess.run([sys.executable, os.path.join(ROOT, "mmleak.py"), "options", "--help"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "environment variables" in r.stdout
    header = facts.c_header()
    rows = re.findall(r'^    X\((\w+), "(MMLEAK_\w+)", (\w+), ("[^"]*"|\d+), (\d+), (\d+), '
                      r'"((?:[^"\\]|\\.)*)"\)', header, re.M)
    assert [r[1] for r in rows] == [o.env for o in facts.OPTIONS
                                    if o.who in ("mmleak.so", "mmleak-scan")]
    for name, env, typ, default, lo, hi, text in rows:
        o = facts.OPTION[env]
        assert (name, typ, int(lo), int(hi), text) == (o.name, o.type, o.min, o.max, o.help)
    for macro in ("MMLEAK_FORMAT_VERSION", "MMLEAK_MAX_DEPTH", "MMLEAK_OPTIONS(X)",
                  "MMLEAK_RUNTIME_OBJECTS(X)", "MMLEAK_WRAPPERS(X)"):
        assert "#define " + macro in header, macro


def test_wrappers_and_runtime_objects_are_one_list():
    """The allocation wrappers and runtime objects the Python side uses are facts.py's, and
    the C header lists the same (the C names: demangled C++ names are the Python side's)."""
    from mmleaklib import facts, sites
    header = facts.c_header()
    block = header[header.index("#define MMLEAK_WRAPPERS(X)"):]
    block = block[:block.index("\n\n")]
    assert re.findall(r'X\("([^"]*)"\)', block) == [w for w in facts.WRAPPERS
                                                    if not facts.is_cxx_name(w)]
    block = header[header.index("#define MMLEAK_RUNTIME_OBJECTS(X)"):]
    block = block[:block.index("\n\n")]
    assert re.findall(r'X\("([^"]*)"\)', block) == list(facts.RUNTIME_OBJECTS)
    assert sites.Wrappers().names == set(facts.WRAPPERS)
    for name in ("libc.so.6", "libc-2.31.so", "libstdc++.so.6", "ld-linux-x86-64.so.2",
                 "libnss_files.so.2", "libtcmalloc_minimal.so.4", "mmleak.so", "librt.so.1"):
        assert facts.RUNTIME_RE.match(name), name
    for name in ("libcurl.so.4", "libmmleak_plugin.so", "demo_leaky", "libmagic.so.1"):
        assert not facts.RUNTIME_RE.match(name), name


def example_command_lines():
    """[(page:line, script, argv)]: every command line of mmleak.py, mmleak-panda.py or
    mmleak-install.py in a literal block of README.rst, docs/ and bench/README.rst (a shell
    session's "$ " line, or a command alone on its line; a path before the script's name,
    variables before it, a pipe into it), cut at what the shell acts on (|, >, <, &&, ;, #), a
    command substitution taken as a number (a pid); the tables of figures left out."""
    script_re = re.compile(r"(?:^\s*(?:\$ )?(?:[A-Z_]+=\S+ )*|\| )(?:\S*/)?"
                           r"(mmleak(?:-panda|-install)?\.py) (.*)")
    out = []
    for page in all_pages() + ["bench/README.rst"]:
        for i, line in enumerate(read(page).splitlines(), 1):
            m = script_re.match(line) if line.startswith("   ") and "``" not in line else None
            if not m:
                continue
            rest = re.sub(r"\$\([^)]*\)", "1", m.group(2))
            rest = re.split(r"\s(?:\||>|2>|<|&&|;|#)|\s\\$", rest)[0]
            if re.search(r"\S\s{3,}\S", rest) or re.search(r"\.\.\.|\[|\b[A-Z]{2,}\b", rest):
                continue        # a row of a table of figures, or a synopsis with placeholders
            if re.match(r"is\b", rest):
                continue        # output naming the script: "/usr/.../mmleak.py is up to date"
            out.append(("%s:%d" % (page, i), m.group(1), rest.split()))
    return out


def test_example_command_lines_parse():
    """Each command line the docs show is one its command accepts today: no option renamed,
    removed or missing its value (an example followed literally must run). Parsed with the
    commands' own parsers, nothing run."""
    import contextlib
    import importlib
    sys.path.insert(0, ROOT)
    from mmleaklib import cli
    parsers = {"mmleak.py": cli.build_parser(),
               "mmleak-panda.py": importlib.import_module("mmleak-panda").build_parser(),
               "mmleak-install.py": importlib.import_module("mmleak-install").build_parser()}
    lines, bad = example_command_lines(), []
    for where, script, argv in lines:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                parsers[script].parse_args(argv)
        except SystemExit as e:
            if e.code:
                bad.append("%s: %s %s: %s" % (where, script, " ".join(argv),
                                              err.getvalue().strip().splitlines()[-1]))
    assert len(lines) >= 50, "the examples were not found: %d" % len(lines)
    assert not bad, "\n".join(bad)
