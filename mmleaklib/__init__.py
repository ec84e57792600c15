"""mmleaklib: the Python side of mmleak, standard library only.

    errors      Fail, warn, the exit statuses of the three tools; command-line checks
    interrupt   Ctrl-C before or after a tool's main: the one line, status 130
    facts       the facts shared with mmleak.so (C): format version, depth, bounds, the
                MMLEAK_* options, runtime objects, allocation wrappers (--c-header)
    layout      where the pieces are: the commands' installed names, the library directories
    files       TraceFiles (every file name), finding traces, the safe open of a dump
                directory's files, the lines a thread has not flushed, new_output
    dumpformat  the line reader and parsers of the dump format (every '#' line, a file's
                head, a scan result's head), problems and their words
    shrink      Shrinker, the reference engine; shrink_files
    native      ctypes binding of mmleak-tools.so: the compiled shrinker, the injector
    blocks      the survivors as native arrays (Live), their per-(stack, kind) aggregates
    symbolize   Maps, Symbolizer (eu-addr2line, --debuginfo-path), frame labels
    elfcode     the objects' function symbols and code (objdump): a function's name and
                offset without debug information, does it hand its block back (wrappers)
    sites       the one table of leak sites, the call-site policy, finding wrappers
    compact     compaction, the trace lock, liveness, recover
    series      the time series of live blocks per call site
    report      build_report, the terminal report, CSV, the exports' model
    export      pprof, folded stacks, heaptrack files
    attach      attach, detach, status
    systemd     mmleak-install.py's unit logic (plan, apply)
    cli         mmleak.py's command line

The names below are the package's API, for scripts and tests (`import mmleaklib`), each
imported from its module when first used (so that `python3 -m mmleaklib.facts` and a tool that
needs a few modules load only those)."""
import importlib

_API = {
    "errors": "EXIT_INPUT EXIT_OK EXIT_PARTIAL EXIT_TOOL EXIT_USAGE Fail Refused warn",
    "facts": "COMPACT_ROTATE_MB FORMAT_VERSION MAX_DEPTH",
    "files": "TraceFiles find_library find_traces new_output unflushed_tail "
             "with_unflushed_tails",
    "dumpformat": "KIND_ALLOC KIND_FREE NO_STACK Alloc Free parse_event parse_header "
                  "parse_stack",
    "shrink": "Shrinker baseline_blocks shrink_files",
    "native": "NATIVE_ABI native_shrink",
    "blocks": "Live Survivors aggregate_allocs time_bounds",
    "symbolize": "Frame Maps Symbolizer frame_label",
    "sites": "Found Site Wrappers base_name find_wrappers human_bytes incremental_sites "
             "is_runtime leak_sites site_resolver sites_from_groups",
    "compact": "TraceLock compact_dir compact_trace trace_alive",
    "series": "read_series series_line_ok",
    "report": "build_report export_model print_top_sites report_wrappers site_table",
    "attach": "mmleak_in traced_state",
    "cli": "main",
}
_WHERE = {name: mod for mod, names in _API.items() for name in names.split()}


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module("." + _WHERE[name], __name__), name)
    try:
        return importlib.import_module("." + name, __name__)     # a module: mmleaklib.files
    except ModuleNotFoundError as e:
        if e.name != __name__ + "." + name:
            raise
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
