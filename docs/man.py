#!/usr/bin/python3
"""Build the manual pages from the reference under docs/ (what `make man` runs):

    python3 docs/man.py OUTDIR docs/mmleak.rst docs/format.rst ...

Each page is written as OUTDIR/NAME.SECTION (mmleak.1, mmleak-format.5, mmleak-env.7...), from
its title and its ":Manual section:" field, by docutils' manual-page writer (the one rst2man
runs, from python3-docutils), with three changes made on the way, so that the text is written
once, in docs/ and in mmleaklib:

* the generated table of docs/environment.rst is made afresh from mmleaklib/facts.py (the
  rows `mmleak options` prints);
* the scripts' names become the installed commands' (``mmleak.py report`` -> ``mmleak
  report``: mmleaklib/layout.py, the rule the installed commands' --help follows too);
* the version of the tools (mmleaklib/facts.py) is the page's version.

A warning from docutils stops the build: one line, with the file and the line.  If
$SOURCE_DATE_EPOCH is set (dpkg-buildpackage sets it), its day is the page's date.
Exit status: 0 built, 1 usage, 2 a page could not be read or converted."""
import io
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mmleaklib import facts, layout  # noqa: E402


def page_name(text, path):
    """'NAME.SECTION' of the page TEXT: its title and its :Manual section: field."""
    title = re.match(r"=+\n(\S+)\n=+\n", text)
    section = re.search(r"^:Manual section: (\d)$", text, re.M)
    if not (title and section):
        raise ValueError("%s:1: no title, or no ':Manual section:' field under it" % path)
    return "%s.%s" % (title.group(1), section.group(1))


def aligned_names(line):
    """LINE with the installed commands' names (layout.installed_names), the text after a
    shortened name moved back to its column at the next gap of two or more spaces: a
    table's cells, a literal block's layout stay where they were."""
    if layout.installed_names(line) == line:
        return line
    out, lost, pos = [], 0, 0
    for m in re.finditer(r"\S+", line):
        sep = line[pos:m.start()]
        if lost and len(sep) >= 2:
            sep += " " * lost
            lost = 0
        word = layout.installed_names(m.group(0))
        lost += len(m.group(0)) - len(word)
        out += [sep, word]
        pos = m.end()
    out.append(line[pos:])
    return "".join(out)


def man_source(text):
    """The reStructuredText the page is made from: TEXT with the changes above."""
    if facts.RST_BEGIN in text:
        text = facts.with_rst_options(text)
    text = "".join(aligned_names(line) for line in text.splitlines(True))
    fields = ":Version: mmleak %s\n" % facts.VERSION
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch and epoch.isdigit():
        fields += ":Date: %s\n" % time.strftime("%Y-%m-%d", time.gmtime(int(epoch)))
    return re.sub(r"^(:Manual group: .*\n)", lambda m: m.group(1) + fields, text, count=1,
                  flags=re.M)


def convert(path):
    """(name, the page in roff) of the reStructuredText file PATH; ValueError: the first
    warning, as 'PATH:LINE: message'."""
    from docutils.core import publish_string
    with open(path, encoding="utf-8") as f:
        text = f.read()
    name = page_name(text, path)
    err = io.StringIO()
    try:
        out = publish_string(man_source(text), source_path=path, writer_name="manpage",
                             settings_overrides={"warning_stream": err, "report_level": 2,
                                                 "halt_level": 2, "output_encoding": "utf-8"})
    except Exception as e:  # noqa: BLE001 - docutils' SystemMessage, one line
        raise ValueError(str(e).splitlines()[0] if str(e) else "%s: %s" % (path, e))
    if err.getvalue():
        raise ValueError(err.getvalue().splitlines()[0])
    return name, out.decode("utf-8")


def main(argv):
    if len(argv) < 2 or argv[0].startswith("-"):
        sys.stderr.write("usage: %s OUTDIR PAGE.rst...\n" % os.path.basename(sys.argv[0]))
        return 1
    outdir, pages = argv[0], argv[1:]
    os.makedirs(outdir, exist_ok=True)
    for path in pages:
        try:
            name, roff = convert(path)
        except ImportError as e:
            sys.stderr.write("man.py: %s: python3-docutils is needed to build the manual "
                             "pages (apt-get install python3-docutils)\n" % e)
            return 2
        except (OSError, ValueError) as e:
            sys.stderr.write("man.py: %s\n" % e)
            return 2
        dest = os.path.join(outdir, name)
        with open(dest + ".tmp", "w", encoding="utf-8") as f:
            f.write(roff)
        os.replace(dest + ".tmp", dest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
