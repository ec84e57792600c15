#!/usr/bin/python3
"""mmleak's leak kinds against valgrind memcheck's (and LeakSanitizer's) on real programs.

    /usr/bin/python3 bench/vs_valgrind.py [--only NAME]... [--no-perturb] [--lsan]

Each program (Debian's python3, perl, git, sqlite3, gawk, sort, grep, sed, tar, xz, jq, bc,
openssl, a C++ program with iostream, exceptions and threads, cmake -P, cppcheck, doxygen,
zstd -T2, htpasswd (APR pools), ldbsearch (talloc), and the daemons redis-server and nginx,
stopped with SIGTERM once their socket exists, and one second more; then bash, grep -P
(PCRE2's JIT), tclsh, lua5.4, xmllint, make -n, openssl s_client, rsync, qemu-img,
ffprobe (libavcodec's threads, posix_memalign), a C++
program with thread_local, a detached thread and sigaltstack, and a C program under
jemalloc and tcmalloc preloaded after mmleak.so; then the fifth comparison's dot,
gs, pdftotext, convert, java, go, gofmt, vim -es, php -r, ruby -e, and the daemons unbound,
haproxy, lighttpd, apache2, mosquitto, rsyslogd, named, dbus-daemon, chronyd and vsftpd;
then the sixth comparison's sshd, cupsd, squid, exim4, smbd and apache2 with its prefork
MPM; then the seventh's postgres, memcached, mariadbd and tmux, and curl, gpg,
ssh-keygen, file, cc1, cc1plus, node, gdb, pigz, xz -T2, sox and espeak-ng; the daemons on
127.0.0.1's ports 25380 to 25396 and 25410 to 25413 or sockets in their directory, each
given a few clients' requests before it is stopped) runs, in a fresh directory of its own,
with its standard input /dev/null, under:

  vg      valgrind --leak-check=full --show-leak-kinds=all (its defaults: __libc_freeres
          and __gnu_cxx::__freeres run at exit)
  vgnf    the same with --run-libc-freeres=no: mmleak does not call __libc_freeres (see
          mmleak-scan(7)), so this is the column to compare with
  mm      mmleak.py run (the scan at exit), then mmleak.py report --no-builtin-suppressions
  mmp     the same with MALLOC_PERTURB_=165 GLIBC_TUNABLES=glibc.malloc.tcache_count=0:
          glibc overwrites freed and new blocks, so no stale pointer is left in memory a
          block was given uninitialised (memcheck knows such words are undefined and skips
          them; mmleak cannot tell), and its per-thread cache, whose blocks it would not
          overwrite, is off (mmleak-scan(7), LIMITS)
  lsan    with --lsan: LD_PRELOAD=liblsan.so.0 (LeakSanitizer preloaded into a binary built
          without it: a rough reference only)

A daemon is stopped by SIGTERM (haproxy's "USR1" row: SIGUSR1, its soft stop); one that
dies of it (haproxy, vsftpd, smbd) has no scan at its exit, nor has one whose scanner may not
read it (squid: mmleak-scan(7), LIMITS), so under mmleak its load ends with
`mmleak.py scan PID` ($SCAN), whose result the report then gives.  A daemon that becomes
another user (mosquitto, chronyd, squid, exim4) gets a dump directory of that user's.
postgres and mariadbd are started as their users through setpriv (valgrind follows that
exec with --trace-children=yes).  The clients run without the tool's preload.
LeakSanitizer's figures are the daemon's own process's (each process writes its report to
a file of its own); a daemon still running 60 s after the signal gets it again.

and prints, per program and tool, blocks/bytes definitely lost, indirectly lost, possibly
lost, still reachable (LSan: blocks/bytes leaked).  A program that is not installed is
skipped.  Nothing is timed: the figures are the verdicts.  Standard library only."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from benchlib import MMLEAK_PY, OUT, PY, ROOT, parser

KINDS = ("definitely", "indirectly", "possibly", "still reachable")
NGINX_CONF = ("daemon off;\\nmaster_process off;\\nerror_log stderr;\\n"
              "pid nginx.pid;\\nevents { worker_connections 64; }\\nhttp { access_log off; "
              "client_body_temp_path tmp; proxy_temp_path tmp; fastcgi_temp_path tmp; "
              "uwsgi_temp_path tmp; scgi_temp_path tmp; server { listen unix:%s/ng.sock; "
              "root %s/html; } }\\n")
# the daemons' files (a setup that is a dict: file name -> text, @DIR@ the directory)
UNBOUND = """server:
 interface: 127.0.0.1
 port: 25380
 do-ip6: no
 username: ""
 chroot: ""
 directory: "@DIR@"
 pidfile: "ub.pid"
 use-syslog: no
 num-threads: 2
 local-zone: "example.test." static
 local-data: "a.example.test. A 10.0.0.1"
remote-control:
 control-enable: no
"""
HAPROXY = """global
 stats socket @DIR@/hap.sock mode 600 level admin
 nbthread 2
defaults
 mode http
 timeout client 30s
 timeout server 30s
 timeout connect 5s
frontend f
 bind 127.0.0.1:25381
 http-request return status 200 content-type text/plain string "hi"
"""
LIGHTTPD = """server.document-root = "@DIR@/html"
server.bind = "127.0.0.1"
server.port = 25382
server.pid-file = "@DIR@/l.pid"
server.errorlog = "@DIR@/err.log"
server.modules = ("mod_staticfile")
index-file.names = ("index.html")
"""
APACHE = """LoadModule mpm_event_module /usr/lib/apache2/modules/mod_mpm_event.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
LoadModule dir_module /usr/lib/apache2/modules/mod_dir.so
LoadModule mime_module /usr/lib/apache2/modules/mod_mime.so
TypesConfig /etc/mime.types
ServerName localhost
ServerRoot @DIR@
Listen 127.0.0.1:25383
PidFile @DIR@/a.pid
ErrorLog @DIR@/err.log
DefaultRuntimeDir @DIR@
Mutex file:@DIR@ default
DocumentRoot @DIR@/html
User www-data
Group www-data
StartServers 1
ServerLimit 1
ThreadsPerChild 4
MinSpareThreads 1
MaxSpareThreads 4
MaxRequestWorkers 4
"""
MOSQUITTO = """listener 25384 127.0.0.1
allow_anonymous true
persistence false
log_dest stderr
"""
RSYSLOG = """global(workDirectory="@DIR@")
module(load="imuxsock" SysSock.Use="off")
input(type="imuxsock" Socket="@DIR@/log.sock")
*.* action(type="omfile" file="@DIR@/out.log")
"""
NAMED = """options {
 directory "@DIR@";
 listen-on port 25385 { 127.0.0.1; };
 listen-on-v6 { none; };
 pid-file "@DIR@/n.pid";
 recursion no;
};
controls { };
zone "example.test" { type primary; file "@DIR@/z.db"; };
"""
ZONE = """$TTL 300
@ IN SOA ns.example.test. h.example.test. 1 3600 600 86400 300
@ IN NS ns.example.test.
ns IN A 127.0.0.1
a IN A 10.0.0.1
"""
DBUS = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
 <type>session</type>
 <listen>unix:path=@DIR@/bus</listen>
 <auth>EXTERNAL</auth>
 <policy context="default">
  <allow send_destination="*" eavesdrop="true"/>
  <allow eavesdrop="true"/>
  <allow own="*"/>
 </policy>
</busconfig>
"""
CHRONY = """port 0
cmdport 25389
bindcmdaddress 127.0.0.1
pidfile @DIR@/c.pid
driftfile @DIR@/drift
"""
VSFTPD = """listen=YES
listen_ipv6=NO
listen_address=127.0.0.1
listen_port=25386
background=NO
anonymous_enable=YES
local_enable=NO
anon_root=@DIR@/ftp
secure_chroot_dir=@DIR@/empty
xferlog_enable=NO
pasv_min_port=25387
pasv_max_port=25388
"""
SSHD = """Port 25390
ListenAddress 127.0.0.1
HostKey @DIR@/hk
PidFile @DIR@/sshd.pid
AuthorizedKeysFile @DIR@/ak
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PrintMotd no
PrintLastLog no
"""
CUPSD = """Listen 127.0.0.1:25391
Browsing Off
LogLevel warn
<Location />
 Order allow,deny
 Allow all
</Location>
"""
CUPS_FILES = """ServerRoot @DIR@
RequestRoot @DIR@/spool
TempDir @DIR@/tmp
CacheDir @DIR@/cache
StateDir @DIR@/state
ErrorLog @DIR@/error_log
AccessLog @DIR@/access_log
PageLog @DIR@/page_log
"""
SQUID = """http_port 127.0.0.1:25392
pid_filename @DIR@/squid.pid
cache_log /dev/stderr
access_log none
cache_store_log none
coredump_dir @DIR@
shutdown_lifetime 1 second
pinger_enable off
http_access allow all
"""
EXIM = """primary_hostname = mail.example.test
spool_directory = @DIR@/spool
log_file_path = @DIR@/log/%slog
keep_environment =
exim_user = Debian-exim
exim_path = @DIR@/exim4
tls_advertise_hosts =
daemon_smtp_ports = 25394
local_interfaces = 127.0.0.1
pid_file_path = @DIR@/exim.pid
acl_smtp_rcpt = acl_rcpt
domainlist local_domains = example.test
begin acl
acl_rcpt:
  accept domains = +local_domains
begin routers
bh:
  driver = redirect
  data = :blackhole:
"""
SMB = """[global]
 smb ports = 25395
 interfaces = 127.0.0.1
 bind interfaces only = yes
 private dir = @DIR@/priv
 lock directory = @DIR@/lock
 state directory = @DIR@/state
 cache directory = @DIR@/cache
 pid directory = @DIR@/pid
 ncalrpc dir = @DIR@/ncalrpc
 log file = @DIR@/log.%m
 disable spoolss = yes
 load printers = no
 map to guest = Bad User
[s]
 path = @DIR@/share
 guest ok = yes
"""
APACHE_PREFORK = (APACHE.replace("mpm_event_module /usr/lib/apache2/modules/mod_mpm_event",
                                 "mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork")
                  .replace("25383", "25396").split("StartServers")[0] +
                  "StartServers 2\nMinSpareServers 1\nMaxSpareServers 2\nMaxRequestWorkers 4\n")
# the seventh comparison: ports 25410 to 25413 of 127.0.0.1, sockets in the directory
PG_BIN = max(__import__("glob").glob("/usr/lib/postgresql/*/bin"), default="/nonexistent",
             key=lambda d: int(d.split("/")[-2]))
AS_POSTGRES = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]
AS_MYSQL = ["setpriv", "--reuid=mysql", "--regid=mysql", "--init-groups"]
PG_LOAD = ("for i in $(seq 600); do pg_isready -q -h @DIR@/sock -p 25410 -U postgres && "
           "break; sleep 0.5; done; for i in 1 2 3; do psql -X -q -h @DIR@/sock -p 25410 -U "
           "postgres -c \"create table t$i(a int, b text); insert into t$i select g, "
           "md5(g::text) from generate_series(1, 2000) g; create index on t$i(b); select "
           "count(*), sum(length(b)) from t$i; select a from t$i order by b limit 2\"; done")
MARIADB_LOAD = ("for i in 1 2 3; do mariadb --no-defaults -S run/m.sock -u root -e \"create "
                "database if not exists d; use d; create table t$i(a int primary key, b text); "
                "insert into t$i select seq, md5(seq) from seq_1_to_2000; select count(*), "
                "sum(length(b)) from t$i; select a from t$i order by b limit 2\"; done")
MEMCACHED_LOAD = ("for i in 1 2 3; do printf 'set k%d 0 0 5\\r\\nhello\\r\\nget k%d\\r\\n"
                  "incr n 1\\r\\nset n 0 0 1\\r\\n1\\r\\nstats\\r\\nquit\\r\\n' $i $i | socat "
                  "- TCP:127.0.0.1:25411 | head -3; done")
# memcached sets both limits of RLIMIT_NOFILE to its -c; valgrind allows that only when the
# hard limit stays its own, the real one less the 12 descriptors it keeps for itself
MEMCACHED_CONNS = str(__import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE)[1]
                      - 12)
# a web server for two requests (curl's), then gone; "up" once it listens
HTTP2 = ("mkdir html && seq 1 3000 > html/a && seq 5 900 > html/b && (timeout 300 python3 -c "
         "'import functools, http.server as h\ns = h.HTTPServer((\"127.0.0.1\", 25413), "
         "functools.partial(h.SimpleHTTPRequestHandler, directory=\"html\"))\nopen(\"up\", "
         "\"w\").close()\nfor i in (1, 2): s.handle_request()' >/dev/null 2>&1 &) && for i in "
         "$(seq 300); do test -e up && break; sleep 0.1; done")
CFILE = ("(echo '#include <stdio.h>'; echo '#include <stdlib.h>'; echo '#include <string.h>'; "
         "for i in $(seq 150); do echo \"int f$i(const int *a, int n) { int s = 0; for (int j "
         "= 0; j < n; j++) s += a[j] * $i + (int)strlen(\\\"x$i\\\"); return s; }\"; done; "
         "echo 'int main(void) { int a[3] = {1, 2, 3}; printf(\"%d\\\\n\", f7(a, 3)); return "
         "0; }') > a.c")
CXXFILE = ("printf '#include <algorithm>\\n#include <map>\\n#include <string>\\n#include "
           "<vector>\\nint f(int n) {\\n  std::map<std::string, std::vector<int>> m;\\n  for "
           "(int i = 0; i < n; i++) m[std::to_string(i %% 7)].push_back(i);\\n  std::vector<int>"
           " v;\\n  for (auto &e : m) v.insert(v.end(), e.second.begin(), e.second.end());\\n  "
           "std::sort(v.begin(), v.end());\\n  return v.empty() ? 0 : v.back();\\n}\\n' > a.cpp")
GDB_PROG = ("printf '#include <stdio.h>\\n#include <stdlib.h>\\nint f(int n) { char *p = "
            "malloc(n); p[0] = 1; return p[0] + n; }\\nint main(void) { printf(\"%%%%d\\\\n\", "
            "f(10)); return 0; }\\n' > p.c && cc -g -O0 -o p p.c")


def prog_name(cc, prog):
    """The path of the compiler proper PROG (cc1, cc1plus) that the driver CC runs, or PROG."""
    try:
        return subprocess.run([cc, "-print-prog-name=" + prog], capture_output=True,
                              text=True).stdout.strip() or prog
    except OSError:
        return prog


PSFILE = """%!PS
/Helvetica findfont 12 scalefont setfont
1 1 40 { /i exch def 72 720 i 15 mul sub moveto (line ) show i 10 string cvs show } for
newpath 300 400 100 0 360 arc stroke
showpage
"""
PROGRAMS = [
    # (name, argv, shell setup in the program's directory, the file whose making says a
    # daemon is ready (then SIGTERM), valgrind options[, environment added])
    ("python3", ["/usr/bin/python3", "-c", "import json, re\nd = {str(i): [i] * 10 for i in "
                 "range(1000)}\nprint(len(json.dumps(d)), re.sub('a+', 'b', 'caaat'))"],
     None, None, []),
    ("perl", ["perl", "-e", "my %h; $h{$_} = [($_) x 10] for 1..1000; my $s = join ',', map "
              "{ scalar @{$h{$_}} } keys %h; print length($s), qq(\\n);"], None, None, []),
    ("git init", ["git", "init", "-q", "repo"], None, None, []),
    ("git add", ["git", "-C", "repo", "add", "."],
     "git init -q repo && cd repo && for i in $(seq 50); do echo line $i > f$i.txt; done",
     None, []),
    ("git commit", ["git", "-C", "repo", "-c", "user.name=t", "-c", "user.email=t@e", "commit",
                    "-q", "-m", "m"],
     "git init -q repo && cd repo && for i in $(seq 50); do echo line $i > f$i.txt; done && "
     "git add .", None, []),
    ("sqlite3", ["sqlite3", ":memory:", "create table t(a,b); with recursive c(x) as (select 1 "
                 "union all select x+1 from c where x<2000) insert into t select x, "
                 "hex(randomblob(20)) from c; create index i on t(b); select count(*), "
                 "sum(length(b)) from t;"], None, None, []),
    ("gawk", ["gawk", "{ a[$1 % 97] += $1; s = s substr($0,1,1) } END { for (k in a) n++; "
              "print n, length(s) }", "in.txt"], "seq 1 20000 > in.txt", None, []),
    ("sort", ["sort", "-n", "in.txt", "-o", "out.txt"],
     "seq 1 20000 | shuf --random-source=/dev/zero > in.txt", None, []),
    ("grep", ["grep", "-E", "-c", "^(1|2)[0-9]*5$", "in.txt"], "seq 1 20000 > in.txt", None,
     []),
    ("sed", ["sed", "-E", "-n", "s/^([0-9])([0-9]*)$/\\2\\1/p", "in.txt"],
     "seq 1 20000 > in.txt", None, []),
    ("tar -cJ", ["tar", "-cJf", "o.tar.xz", "d"],
     "mkdir d && seq 1 20000 > d/a && seq 5 30000 > d/b", None, []),
    ("xz", ["xz", "-k", "-6", "in.txt"], "seq 1 50000 > in.txt", None, []),
    ("jq", ["jq", "-s", "map(select(.k % 3 == 0)) | length", "in.json"],
     "seq 1 2000 | sed 's/.*/{\"k\":&,\"v\":\"x&\"}/' > in.json", None, []),
    ("bc", ["bc", "-l", "-q", "in.bc"], "printf 'scale=300\\n4*a(1)\\nquit\\n' > in.bc", None,
     []),
    ("openssl dgst", ["openssl", "dgst", "-sha256", "in.txt"], "seq 1 20000 > in.txt", None,
     []),
    ("openssl genpkey", ["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                        "rsa_keygen_bits:1024", "-out", "k.pem"], None, None, []),
    ("C++ threads", [os.path.join(OUT, "vs_valgrind_cxx")], None, None, []),
    ("cmake -P", ["cmake", "-P", "s.cmake"],
     "printf 'set(L)\\nforeach(i RANGE 1 3000)\\n  string(SHA256 h \"x${i}\")\\n  list(APPEND L "
     "${h})\\nendforeach()\\nlist(SORT L)\\nlist(LENGTH L n)\\nmessage(\"${n}\")\\n' > s.cmake",
     None, []),
    ("cppcheck", ["cppcheck", "--enable=all", "--inconclusive", "-q", "a.c"],
     "printf '#include <stdlib.h>\\nint f(int n){char *p=malloc(n); if(n>3) return 1; free(p); "
     "return n;}\\nint main(void){return f(2);}\\n' > a.c", None, []),
    # one thread: with two, doxygen's own lost strings change from run to run
    ("doxygen", ["doxygen", "Doxyfile"],
     "cp %s/tracer/*.h . && doxygen -g Doxyfile >/dev/null && printf 'GENERATE_LATEX=NO\\n"
     "QUIET=YES\\nEXTRACT_ALL=YES\\nHAVE_DOT=NO\\nNUM_PROC_THREADS=1\\n' >> Doxyfile" % ROOT,
     None, []),
    ("zstd -T2", ["zstd", "-q", "-T2", "-3", "in.txt"], "seq 1 1500000 > in.txt", None, []),
    ("htpasswd", ["htpasswd", "-c", "-b", "-B", "-C", "5", "pw", "u", "secret"], None, None, []),
    ("ldbsearch", ["ldbsearch", "-H", "t.ldb", "(cn=u1*)", "cn"],
     "for i in $(seq 200); do printf 'dn: cn=u%d,dc=x\\ncn: u%d\\n\\n' $i $i; done > in.ldif && "
     "ldbadd -H t.ldb in.ldif >/dev/null", None, []),
    ("redis-server", ["redis-server", "--port", "0", "--save", "", "--appendonly", "no",
                      "--unixsocket", "r.sock", "--daemonize", "no"], None, "r.sock",
     ["--soname-synonyms=somalloc=*jemalloc*"]),     # Debian's redis uses jemalloc
    ("nginx", ["nginx", "-p", ".", "-c", "ng.conf"],
     "mkdir -p logs html && echo hi > html/index.html && printf '%s' \"$PWD\" \"$PWD\" > "
     "ng.conf" % NGINX_CONF, "ng.sock", []),
    # (bash: its exit() in the end; no command substitution, whose child would be another
    # trace)
    ("bash", ["bash", "-c", "declare -A a; f() { local x=$1; printf -v r '%s' \"${x//1/one}\"; "
              "}; for i in {1..2000}; do a[k$i]=$((i * i)); f $i; s+=${r:0:1}; done; "
              "echo ${#a[@]} ${#s}"], None, None, []),
    ("grep -P", ["grep", "-P", "-c", "^(\\d)\\d*\\1$", "in.txt"], "seq 1 20000 > in.txt",
     None, []),
    ("tclsh", ["tclsh", "s.tcl"],
     "printf 'set d [dict create]\\nfor {set i 0} {$i < 3000} {incr i} { dict set d k$i "
     "[string repeat x [expr {$i %% 50}]] }\\nset l [lsort [dict keys $d]]\\nputs "
     "[llength $l]\\n' > s.tcl", None, []),
    ("lua", ["lua5.4", "-e", "local t = {} for i = 1, 20000 do t[i] = string.rep('x', i % "
             "64) .. i end table.sort(t) local m = {} for _, v in ipairs(t) do m[v] = #v end "
             "print(#t) collectgarbage()"], None, None, []),
    ("xmllint", ["xmllint", "--xpath", "count(//e[@k mod 3 = 0])", "in.xml"],
     "(echo '<r>'; seq 1 3000 | sed 's/.*/<e k=\"&\">v&<\\/e>/'; echo '</r>') > in.xml",
     None, []),
    ("make -n", ["make", "-n", "-j1"],
     "printf 'OBJS := $(patsubst %%,o%%.o,$(shell seq 1 300))\\nall: $(OBJS)\\n"
     "o%%.o: s%%.c\\n\\tcc -c $< -o $@\\ns%%.c:\\n\\techo > $@\\n' > Makefile", None, []),
    ("openssl s_client", ["openssl", "s_client", "-connect", "127.0.0.1:1"], None, None, []),
    ("rsync", ["rsync", "-a", "src/", "dst/"],
     "mkdir src && for i in $(seq 100); do seq $i 2000 > src/f$i; done", None,
     []),
    ("qemu-img", ["qemu-img", "info", "d.qcow2"], "qemu-img create -q -f qcow2 d.qcow2 64M",
     None, []),
    ("ffprobe", ["ffprobe", "-v", "error", "-count_frames", "-show_streams", "t.mp4"],
     "ffmpeg -v error -f lavfi -i testsrc=duration=2:size=320x240:rate=25 -c:v mpeg4 t.mp4",
     None, []),
    ("C++ thread_local", [os.path.join(OUT, "vs_valgrind_tls")], None, None, []),
    ("jemalloc", [os.path.join(OUT, "vs_valgrind_alloc")], None, None,
     ["--soname-synonyms=somalloc=*jemalloc*"], {"LD_PRELOAD": "libjemalloc.so.2"}),
    ("tcmalloc", [os.path.join(OUT, "vs_valgrind_alloc")], None, None,
     ["--soname-synonyms=somalloc=*tcmalloc*"], {"LD_PRELOAD": "libtcmalloc_minimal.so.4"}),
    # kinds of program of the fifth comparison (mmleak-scan(7))
    ("dot", ["dot", "-Tsvg", "g.dot", "-o", "g.svg"],
     "(echo 'digraph g {'; for i in $(seq 300); do echo \"n$i -> n$((i * 7 % 300));\"; "
     "done; echo '}') > g.dot", None, []),
    ("dot, G_SLICE", ["dot", "-Tsvg", "g.dot", "-o", "g.svg"],
     "(echo 'digraph g {'; for i in $(seq 300); do echo \"n$i -> n$((i * 7 % 300));\"; "
     "done; echo '}') > g.dot", None, [], {"G_SLICE": "always-malloc"}),
    ("gs", ["gs", "-q", "-dNOPAUSE", "-dBATCH", "-dSAFER", "-sDEVICE=png16m", "-r40",
            "-o", "p.png", "p.ps"], {"p.ps": PSFILE}, None, []),
    ("pdftotext", ["pdftotext", "p.pdf", "p.txt"],
     "printf '%s' \"$PS\" > p.ps && ps2pdf p.ps p.pdf", None, [], {"PS": PSFILE}),
    ("convert", ["convert-im6.q16", "-size", "300x200", "xc:white", "-fill", "red", "-draw",
                 "circle 150,100 200,150", "-blur", "0x2", "-resize", "50%", "o.png"],
     None, None, []),
    ("convert, G_SLICE", ["convert-im6.q16", "-size", "300x200", "xc:white", "-fill", "red",
                          "-draw", "circle 150,100 200,150", "-blur", "0x2", "-resize", "50%",
                          "o.png"], None, None, [], {"G_SLICE": "always-malloc"}),
    ("java", ["java", "-Xmx64m", "-XX:+UseSerialGC", "-Xshare:off", "-cp", ".", "H"],
     "printf 'public class H { public static void main(String[] a) { java.util.Map<String, "
     "Integer> m = new java.util.HashMap<>(); for (int i = 0; i < 20000; i++) m.put(\"k\" + "
     "i, i); System.out.println(m.size()); } }\\n' > H.java && javac H.java", None, []),
    ("go env", ["go", "env", "GOROOT"], None, None, []),
    ("gofmt", ["gofmt", "-l", "a.go"], "printf 'package a\\nfunc F() int { return 1 }\\n' "
     "> a.go", None, []),
    ("vim -es", ["vim", "-es", "-u", "NONE", "-i", "NONE", "-N", "-c",
                 "%s/\\(\\d\\+\\)/<\\1>/g", "-c", "sort n", "-c", "wq", "in.txt"],
     "seq 1 5000 > in.txt", None, []),
    ("php -r", ["php", "-n", "-r", "$a = []; for ($i = 0; $i < 20000; $i++) $a['k'.$i] = "
                "str_repeat('x', $i % 50); ksort($a); echo count($a), PHP_EOL;"],
     None, None, []),
    ("ruby -e", ["ruby", "-e", "h = {}; 20000.times { |i| h[\"k#{i}\"] = 'x' * (i % 50) }; "
                 "puts h.keys.sort.size"], None, None, []),
    # daemons in the foreground on 127.0.0.1's ports 25380 to 25389 or sockets in their
    # directory, a few clients' requests (the last element), then SIGTERM
    ("unbound", ["unbound", "-d", "-c", "ub.conf"], {"ub.conf": UNBOUND}, "tcp:25380", [], {},
     "for i in 1 2 3; do for n in a b; do dig +short +tries=1 +time=30 -p 25380 @127.0.0.1 "
     "$n.example.test; done; done"),
    ("haproxy", ["haproxy", "-db", "-f", "hap.cfg"], {"hap.cfg": HAPROXY}, "hap.sock", [], {},
     "for i in 1 2 3; do curl -sS http://127.0.0.1:25381/x; done; $SCAN"),
    ("haproxy USR1", ["haproxy", "-db", "-f", "hap.cfg"], {"hap.cfg": HAPROXY}, "hap.sock", [],
     {}, "for i in 1 2 3; do curl -sS http://127.0.0.1:25381/x; done", signal.SIGUSR1),
    ("lighttpd", ["lighttpd", "-D", "-f", "l.conf"], {"l.conf": LIGHTTPD, "html/index.html":
                                                        "hi\n"}, "tcp:25382", [], {},
     "for i in 1 2 3; do curl -sS http://127.0.0.1:25382/; curl -sS -o /dev/null -w '%{"
     "http_code} ' http://127.0.0.1:25382/nothing; done"),
    ("apache2", ["apache2", "-DFOREGROUND", "-f", "@DIR@/a.conf"],
     {"a.conf": APACHE, "html/index.html": "hi\n"}, "tcp:25383", [], {},
     "for i in 1 2 3; do curl -sS http://127.0.0.1:25383/; done"),
    ("mosquitto", ["mosquitto", "-c", "m.conf"], {"m.conf": MOSQUITTO}, "tcp:25384", [], {},
     "(timeout 60 mosquitto_sub -p 25384 -t t -C 3 &) ; sleep 3; for i in 1 2 3; do "
     "mosquitto_pub -p 25384 -t t -m m$i -r; done; sleep 2", signal.SIGTERM, "mosquitto"),
    ("rsyslogd", ["rsyslogd", "-n", "-f", "@DIR@/rs.conf", "-i", "@DIR@/rs.pid"],
     {"rs.conf": RSYSLOG}, "log.sock", [], {},
     "for i in 1 2 3; do logger -u log.sock m$i; done; sleep 2; cat out.log | wc -l"),
    ("named", ["named", "-g", "-n", "2", "-c", "@DIR@/n.conf"], {"n.conf": NAMED, "z.db": ZONE},
     "tcp:25385", ["--soname-synonyms=somalloc=*jemalloc*"], {},
     "for i in 1 2 3; do for n in a b; do dig +short +tries=1 +time=30 -p 25385 @127.0.0.1 "
     "$n.example.test; done; done"),
    ("dbus-daemon", ["dbus-daemon", "--config-file=@DIR@/d.conf", "--nofork", "--nopidfile"],
     {"d.conf": DBUS}, "bus", [], {},
     "for i in 1 2 3; do dbus-send --bus=unix:path=bus --print-reply --dest=org.freedesktop."
     "DBus /org/freedesktop/DBus org.freedesktop.DBus.ListNames | wc -l; done"),
    ("chronyd", ["chronyd", "-d", "-x", "-f", "@DIR@/c.conf"], {"c.conf": CHRONY},
     "c.pid", [], {}, "for i in 1 2 3; do chronyc -h 127.0.0.1 -p 25389 tracking | "
     "head -2; done", signal.SIGTERM, "_chrony"),
    ("vsftpd", ["vsftpd", "@DIR@/v.conf"], {"v.conf": VSFTPD, "ftp/f.txt": "hi\n",
                                            "empty/.keep": ""}, "tcp:25386", [], {},
     "for i in 1 2 3; do curl -sS ftp://127.0.0.1:25386/f.txt; done; $SCAN"),
    # the sixth comparison's daemons: ports 25390 to 25396 (sshd, ssh's key and the host's
    # made by the setup; a setup that is a pair: the files, then a shell command)
    ("sshd", ["/usr/sbin/sshd", "-D", "-e", "-f", "@DIR@/sshd_config"],
     ({"sshd_config": SSHD}, "ssh-keygen -q -t ed25519 -N '' -f hk && ssh-keygen -q -t "
      "ed25519 -N '' -f id && cp id.pub ak && { test -d /run/sshd || mkdir -m 755 /run/sshd; }"),
     "tcp:25390", [], {},
     "for i in 1 2; do ssh -p 25390 -i id -o StrictHostKeyChecking=no -o UserKnownHostsFile="
     "/dev/null -o BatchMode=yes root@127.0.0.1 echo hi $i; done"),
    ("cupsd", ["cupsd", "-f", "-c", "@DIR@/cupsd.conf", "-s", "@DIR@/cups-files.conf"],
     ({"cupsd.conf": CUPSD, "cups-files.conf": CUPS_FILES}, "mkdir spool tmp cache state"),
     "tcp:25391", [], {},
     "for i in 1 2 3; do lpstat -h 127.0.0.1:25391 -r; lpstat -h 127.0.0.1:25391 -t; done"),
    ("squid", ["squid", "-N", "-f", "@DIR@/squid.conf"], {"squid.conf": SQUID,
                                                         "html/index.html": "hi\n"},
     "tcp:25392", [], {},
     "(cd html && exec env -u LD_PRELOAD timeout 60 python3 -m http.server -b 127.0.0.1 "
     "25393 >/dev/null 2>&1) & sleep 4; for i in 1 2 3; do curl -sS -x http://127.0.0.1:25392 "
     "http://127.0.0.1:25393/index.html; done; kill $!; $SCAN", signal.SIGTERM, "proxy"),
    # (a copy without the set-uid bit, which valgrind refuses; it re-executes itself as
    # exim_path)
    ("exim4", ["@DIR@/exim4", "-C", "@DIR@/exim.conf", "-bdf", "-q30m"],
     ({"exim.conf": EXIM}, "cp /usr/sbin/exim4 . && mkdir spool log && chown "
      "Debian-exim:Debian-exim spool log"),
     "tcp:25394", [], {},
     "for i in 1 2 3; do swaks --server 127.0.0.1:25394 --to u$i@example.test --from "
     "a@example.test --silent 2 && echo sent $i; done; sleep 2", signal.SIGTERM,
     "Debian-exim"),
    ("smbd", ["smbd", "-F", "--debug-stdout", "-s", "@DIR@/smb.conf"],
     ({"smb.conf": SMB, "share/f.txt": "hi\n"}, "mkdir priv lock state cache pid"),
     "tcp:25395", [], {},
     "for i in 1 2 3; do smbclient //127.0.0.1/s -p 25395 -N -s smb.conf -c 'ls; get f.txt "
     "/dev/stdout'; done; $SCAN"),
    ("apache2 prefork", ["apache2", "-DFOREGROUND", "-f", "@DIR@/a.conf"],
     {"a.conf": APACHE_PREFORK, "html/index.html": "hi\n"}, "tcp:25396", [], {},
     "for i in 1 2 3 4 5 6; do curl -sS http://127.0.0.1:25396/; done"),
    # the seventh comparison (ports 25410 to 25413): daemons that fork without exec,
    # shared memory, their own allocators; then tools that exec, spawn an agent, use threads
    # (a program's LOAD: a shell command run once it has ended, to stop what it started)
    ("postgres", AS_POSTGRES + [PG_BIN + "/postgres", "-D", "@DIR@/data", "-p", "25410", "-k",
                                "@DIR@/sock", "-c", "listen_addresses="],
     "mkdir data sock && chown postgres: data sock && %s %s/initdb -D data -A trust -U "
     "postgres --no-sync >/dev/null" % (" ".join(AS_POSTGRES), PG_BIN), "sock/.s.PGSQL.25410",
     ["--trace-children=yes"], {}, PG_LOAD, signal.SIGTERM, "postgres"),
    ("memcached", ["memcached", "-u", "memcache", "-l", "127.0.0.1", "-p", "25411", "-U", "0",
                   "-t", "2", "-m", "16", "-c", MEMCACHED_CONNS], None, "tcp:25411", [], {},
     MEMCACHED_LOAD, signal.SIGTERM, "memcache"),
    ("mariadbd", AS_MYSQL + ["/usr/sbin/mariadbd", "--no-defaults", "--datadir=@DIR@/data",
                  "--socket=@DIR@/run/m.sock", "--port=25412", "--bind-address=127.0.0.1",
                  "--pid-file=@DIR@/run/m.pid", "--innodb-buffer-pool-size=8M",
                  # (its default reserves 8 TiB of address space, which valgrind cannot map)
                  "--innodb-buffer-pool-size-max=8M", "--innodb-log-file-size=4M",
                  "--innodb-use-native-aio=0"],
     "mkdir data run && chown mysql: data run && mariadb-install-db --no-defaults --datadir="
     "$PWD/data --user=mysql --auth-root-authentication-method=socket --skip-test-db "
     ">/dev/null", "run/m.sock", ["--trace-children=yes"], {}, MARIADB_LOAD, signal.SIGTERM,
     "mysql"),
    ("tmux", ["tmux", "-D", "-S", "@DIR@/t.sock", "-f", "/dev/null"], None, "t.sock", [], {},
     "tmux -S t.sock new -d -s x 'sleep 100'; tmux -S t.sock new-window -d 'seq 100'; "
     "tmux -S t.sock ls"),
    ("curl", ["curl", "-sS", "-o", "a", "-o", "b", "http://127.0.0.1:25413/a",
              "http://127.0.0.1:25413/b"], HTTP2, None, []),
    ("gpg", ["gpg", "--batch", "--passphrase", "", "--pinentry-mode", "loopback",
             "--quick-gen-key", "t <t@example.test>", "ed25519"], None, None, [], {},
     "gpgconf --kill gpg-agent"),
    ("ssh-keygen", ["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-C", "t", "-f", "k"], None,
     None, []),
    ("file", ["file", "a.txt", "a.txt.gz", "t", "d", "p.png"],
     "seq 1 2000 > a.txt && gzip -k a.txt && cp /bin/true t && mkdir d && printf "
     "'\\211PNG\\r\\n\\032\\n' > p.png", None, []),
    ("cc1", [prog_name("gcc", "cc1"), "-quiet", "-imultiarch", "x86_64-linux-gnu", "-O2",
             "a.c", "-o", "a.s"], CFILE, None, []),
    ("cc1plus", [prog_name("g++", "cc1plus"), "-quiet", "-imultiarch", "x86_64-linux-gnu",
                 "-D_GNU_SOURCE", "-O2", "a.cpp", "-o", "a.s"], CXXFILE, None, []),
    ("node -e", ["node", "-e", "const m = new Map(); for (let i = 0; i < 20000; i++) "
                 "m.set('k' + i, 'x'.repeat(i % 50)); console.log(m.size)"], None, None, []),
    ("gdb -batch", ["gdb", "-batch", "-nx", "-ex", "break f", "-ex", "run", "-ex", "bt", "-ex",
                    "info locals", "-ex", "kill", "./p"], GDB_PROG, None, []),
    ("pigz -p2", ["pigz", "-k", "-p", "2", "in.txt"], "seq 1 300000 > in.txt", None, []),
    ("xz -T2", ["xz", "-k", "-T2", "--block-size=200KiB", "-6", "in.txt"],
     "seq 1 200000 > in.txt", None, []),
    ("sox", ["sox", "-n", "o.wav", "synth", "1", "sine", "440", "gain", "-3"], None, None, []),
    ("espeak-ng", ["espeak-ng", "-w", "o.wav", "Hello world, this is a test."], None, None,
     []),
]


# daemons that call setsid() in the foreground and exit when it fails (see run)
OWN_SESSION = {"smbd"}


def is_ready(cwd, ready):
    """READY: a file in CWD, or tcp:PORT, a port of 127.0.0.1 that accepts a connection."""
    if not ready.startswith("tcp:"):
        return os.path.exists(os.path.join(cwd, ready))
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", int(ready[4:]))) == 0


def run(argv, env, cwd, ready, child, load=None, stop=signal.SIGTERM):
    """Run ARGV; with READY, a daemon: once READY (is_ready) and one second more, run the
    shell command LOAD in CWD (its clients' requests), then send STOP to it, or (CHILD)
    to its first child (the program under mmleak.py run); without, a program, and LOAD
    once it has ended.  The CompletedProcess."""
    if ready is None:
        r = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                           timeout=900, stdin=subprocess.DEVNULL)
        if load:
            # a program's LOAD: what stops the daemons it started (gpg's agent), untraced
            subprocess.run(load, shell=True, cwd=cwd, capture_output=True, timeout=300,
                           env={k: v for k, v in env.items() if k != "LD_PRELOAD"})
        return r
    # a session of its own: apache2's prefork MPM signals its whole group (killpg); but not
    # for a daemon that makes its own session in the foreground and stops if setsid() fails,
    # as it does in a session leader (smbd -F: "Failed to create session", status 1)
    # stderr to a file, not a pipe read only at the end: smbd's child and postgres under
    # valgrind (a summary per backend, its log) filled the pipe, and every process writing
    # to it waited for ever
    errf = tempfile.TemporaryFile("w+")
    p = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=errf, text=True,
                         start_new_session=not any(os.path.basename(a) in OWN_SESSION
                                                   for a in argv))

    def communicate(timeout=None):
        p.wait(timeout)
        errf.seek(0)
        return None, errf.read()
    until = time.monotonic() + 300         # valgrind on a busy machine: exim4 took 2 min
    while not is_ready(cwd, ready) and time.monotonic() < until:
        time.sleep(0.1)
    time.sleep(1)
    pid = p.pid
    if p.poll() is not None or not is_ready(cwd, ready):
        out, err = communicate()
        raise RuntimeError("%s: not ready (%s): %s" % (argv[0], p.returncode, err[-500:]))
    if child:
        with open("/proc/%d/task/%d/children" % (p.pid, p.pid)) as f:
            pid = int(f.read().split()[0])
    if load:
        # $SCAN: under mmleak, the command that scans the daemon now (mmleak.py scan)
        scan = "%s %s scan %d" % (PY, MMLEAK_PY, pid) if child else "true"
        # the clients without the daemon's preload (pg_isready dies of SIGSEGV under
        # liblsan.so.0; none of them is measured)
        lr = subprocess.run(load, shell=True, cwd=cwd, env=dict(
            {k: v for k, v in env.items() if k != "LD_PRELOAD"}, SCAN=scan),
                            capture_output=True,
                            text=True, timeout=300)
        sys.stderr.write("  load: status %d, %s\n" % (lr.returncode,
                                                      (lr.stdout + lr.stderr)[-300:].strip()))
        time.sleep(1)
    os.kill(pid, stop)
    try:
        out, err = communicate(timeout=60)
    except subprocess.TimeoutExpired:
        # cupsd under valgrind: a SIGTERM that came between its loop's test of the flag the
        # handler sets and its epoll_wait leaves it waiting; a second one stops it
        sys.stderr.write("  %s: still running 60 s after the signal; sent again\n" % argv[0])
        os.kill(pid, stop)
        out, err = communicate(timeout=900)
    r = subprocess.CompletedProcess(argv, p.returncode, out, err)
    r.pid = pid
    return r


def number(s):
    return int(s.replace(",", ""))


class CannotRun(Exception):
    """The tool could not run the program to its end (a row of its own says why)."""


def save(keep, text):
    """Write TEXT (a tool's output) to the file KEEP (--keep), if given."""
    if keep:
        with open(keep, "w") as f:
            f.write(text)


def valgrind(argv, env, cwd, ready, opts, freeres, load=None, keep=None, stop=signal.SIGTERM):
    r = run(["valgrind", "--leak-check=full", "--show-leak-kinds=all",
             "--errors-for-leak-kinds=none"] + opts +
            ([] if freeres else ["--run-libc-freeres=no"]) + argv, env, cwd, ready, False,
            load, stop)
    save(keep, r.stderr)
    # an instruction its JIT does not know (valgrind 3.19: rdtscp, which some library of
    # ffprobe's runs) kills the program with SIGILL: its summary is that of a crash
    m = re.search(r"^==\d+== valgrind: Unrecognised instruction.*$", r.stderr, re.M)
    if m:
        bad = re.search(r"unhandled instruction bytes: ((?:0x[0-9A-F]+ ?){1,4})", r.stderr)
        raise CannotRun("valgrind: unrecognised instruction%s" % (
            " " + bad.group(1).strip() if bad else ""))
    # the command's own process: the first to write (a forked child, which valgrind follows
    # without --trace-children, writes its own summary, often before its parent's)
    pid = re.search(r"^==(\d+)==", r.stderr, re.M)
    pid = pid.group(1) if pid else r"\d+"
    got = {}
    for k in KINDS:
        m = re.search(r"==%s==\s+%s(?: lost)?: ([\d,]+) bytes in ([\d,]+) blocks" % (pid, k),
                      r.stderr)
        got[k] = (number(m.group(2)), number(m.group(1))) if m else (0, 0)
    if "LEAK SUMMARY" not in r.stderr and "no leaks are possible" not in r.stderr:
        raise RuntimeError("valgrind gave no leak summary: %s" % r.stderr[-500:])
    return got


def users_dir(d, user=None):
    """Make directory D, owned by USER (a daemon that becomes USER writes its files there)."""
    os.mkdir(d)
    if user:
        pw = __import__("pwd").getpwnam(user)
        os.chown(d, pw.pw_uid, pw.pw_gid)
    return d


def mmleak(argv, env, cwd, ready, load=None, keep=None, stop=signal.SIGTERM, user=None):
    # a daemon that becomes USER: the directory is that user's (one anybody can write would
    # do for its files, but mmleak.py run leaves another user's traces out of it)
    d = users_dir(os.path.join(cwd, ".mmleak"), user)
    r = run([PY, MMLEAK_PY, "run", "-d", d, "--"] + argv, env, cwd, ready, True, load, stop)
    save(keep and keep + ".run", r.stderr)
    run_err = r.stderr
    nxt = [l for l in r.stderr.splitlines() if " next: " in l]
    if not nxt and "wrote no dump files" in r.stderr:
        raise CannotRun("no trace: a static program (Go's, say) does not load mmleak.so")
    if not nxt:
        raise RuntimeError("mmleak.py run: %s" % r.stderr[-500:])
    nxt = nxt[-1].split()
    # (with --keep, the still reachable blocks' sites too, to set beside valgrind's records)
    r = subprocess.run([PY, MMLEAK_PY, "report", d, "--no-html", "--no-builtin-suppressions",
                        nxt[-2], nxt[-1]] + (["--show-reachable"] if keep else []),
                       env=env, capture_output=True, text=True, timeout=900)
    save(keep, r.stdout + r.stderr)
    got = {}
    for k in KINDS:
        m = re.search(r"^    %s(?: lost)?: +(\d+) bytes.* in (\d+) blocks$" % k, r.stdout, re.M)
        if not m and not re.search(r"^    definitely lost: ", r.stdout, re.M):
            # no scan at the exit (a fatal signal, _exit, a seccomp filter: mmleak-scan(7))
            ended = re.search(r" ended \(([^)]*)\)", run_err)
            raise CannotRun("no scan; %s" % (ended.group(1) if ended else "see --keep"))
        if not m:
            raise RuntimeError("mmleak.py report: %s" % (r.stdout + r.stderr)[-500:])
        got[k] = (int(m.group(2)), int(m.group(1)))
    return got


def lsan(argv, env, cwd, ready, load=None, keep=None, stop=signal.SIGTERM, user=None):
    # first: the program's own preload (an allocator) after it, as for mmleak.so
    # a daemon: each process's report in a file of its own (log_path), the daemon's read (its
    # children, which inherit the preload, write theirs first), in a directory of USER's
    logs = users_dir(os.path.join(cwd, ".lsan"), user)
    log = os.path.join(logs, "lsan")
    e = dict(env, LD_PRELOAD=" ".join(["liblsan.so.0"] + env.get("LD_PRELOAD", "").split()),
             LSAN_OPTIONS="exitcode=0" + (":log_path=" + log if ready else ""))
    r = run(argv, e, cwd, ready, False, load, stop)
    if ready:
        r.stderr += "".join("== %s\n%s" % (f, open(os.path.join(logs, f)).read())
                            for f in sorted(os.listdir(logs)))
        mine = "%s.%d" % (log, r.pid)
        save(keep, r.stderr)
        if not os.path.exists(mine):
            return (0, 0)
        with open(mine) as f:
            r.stderr = f.read()
    else:
        save(keep, r.stderr)
    m = re.search(r"SUMMARY: LeakSanitizer: (\d+) byte\(s\) leaked in (\d+) allocation",
                  r.stderr)
    return (int(m.group(2)), int(m.group(1))) if m else (0, 0)


def main():
    ap = parser(__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
                epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--only", action="append", metavar="NAME",
                    help="only this program (repeatable): %s" % ", ".join(
                        n for n, *_ in PROGRAMS))
    ap.add_argument("--no-perturb", action="store_true", help="no mmp column")
    ap.add_argument("--lsan", action="store_true", help="an lsan column (liblsan.so.0)")
    ap.add_argument("--tools", metavar="T,...", help="these columns only, in this order "
                    "(vg, vgnf, mm, mmp, lsan)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    ap.add_argument("--keep", metavar="DIR", help="write each tool's output (valgrind's and "
                    "LeakSanitizer's stderr, mmleak's report) to DIR/PROGRAM.TOOL")
    a = ap.parse_args()
    if not shutil.which("valgrind"):
        sys.exit("vs_valgrind.py: valgrind is not installed")
    os.makedirs(OUT, exist_ok=True)
    for exe, src in (("vs_valgrind_cxx", "vs_valgrind_cxx.cpp"),
                     ("vs_valgrind_tls", "vs_valgrind_tls.cpp"),
                     ("vs_valgrind_alloc", "vs_valgrind_alloc.c")):
        subprocess.run(["c++" if src.endswith(".cpp") else "cc", "-O1", "-g", "-pthread", "-o",
                        os.path.join(OUT, exe), os.path.join(ROOT, "bench", src)], check=True)
    tools = ["vg", "vgnf", "mm"] + ([] if a.no_perturb else ["mmp"]) + (["lsan"] if a.lsan
                                                                        else [])
    if a.tools:
        tools = a.tools.split(",")
    print("%-16s %-5s %14s %14s %14s %18s" % ("program", "tool", "definite", "indirect",
                                              "possible", "reachable"))
    results = {}
    for name, argv0, setup, ready, vgopts, *more in PROGRAMS:
        if a.only and name not in a.only:
            continue
        added = more[0] if more else {}
        load0 = more[1] if len(more) > 1 else None
        stop = more[2] if len(more) > 2 else signal.SIGTERM
        user = more[3] if len(more) > 3 else None
        argv = argv0
        pre = [p for p in added.get("LD_PRELOAD", "").split() if not os.path.isabs(p)]
        # (a program started through setpriv: the program's own name)
        prog = [x for x in argv if not x.startswith("--")][1 if argv[0] == "setpriv" else 0]
        missing = [prog] if not shutil.which(prog.replace("@DIR@/", "")) else [
            p for p in pre if not os.path.exists(os.path.join("/usr/lib/x86_64-linux-gnu", p))]
        if missing:
            print("%-16s (not installed: %s)" % (name, missing[0]))
            continue
        results[name] = {}
        for tool in tools:
            with tempfile.TemporaryDirectory(prefix="vs-valgrind-") as cwd:
                os.chmod(cwd, 0o755)        # for a daemon that drops its privileges
                argv = [x.replace("@DIR@", cwd) for x in argv0]
                load = load0 and load0.replace("@DIR@", cwd)
                env = dict(os.environ, LC_ALL="C", HOME=cwd, PYTHONMALLOC="malloc")
                env.pop("MMLEAK_SUPPRESSIONS", None)
                env.pop("LD_PRELOAD", None)
                env.update(added)
                if tool == "mmp":
                    env["MALLOC_PERTURB_"] = "165"
                    env["GLIBC_TUNABLES"] = ":".join(
                        [t for t in [env.get("GLIBC_TUNABLES")] if t] +
                        ["glibc.malloc.tcache_count=0"])
                files, sh = setup if isinstance(setup, tuple) else (
                    (setup, None) if isinstance(setup, dict) else ({}, setup))
                if files:
                    for fn, text in files.items():
                        os.makedirs(os.path.join(cwd, os.path.dirname(fn)), exist_ok=True)
                        with open(os.path.join(cwd, fn), "w") as f:
                            f.write(text.replace("@DIR@", cwd))
                if sh:
                    subprocess.run(sh, shell=True, cwd=cwd, env=env, check=True,
                                   capture_output=True)
                keep = a.keep and os.path.join(a.keep, "%s.%s" % (name.replace(" ", "_"), tool))
                if tool in ("vg", "vgnf"):
                    try:
                        got = valgrind(argv, env, cwd, ready, vgopts, tool == "vg", load, keep,
                                       stop)
                    except CannotRun as e:
                        print("%-16s %-5s (%s)" % (name, tool, e), flush=True)
                        results[name][tool] = str(e)
                        continue
                elif tool in ("mm", "mmp"):
                    try:
                        got = mmleak(argv, env, cwd, ready, load, keep, stop, user)
                    except CannotRun as e:
                        print("%-16s %-5s (%s)" % (name, tool, e), flush=True)
                        results[name][tool] = str(e)
                        continue
                else:
                    n, b = lsan(argv, env, cwd, ready, load, keep, stop, user)
                    print("%-16s %-5s %14s" % (name, tool, "%d/%d" % (n, b)), flush=True)
                    results[name][tool] = [n, b]
                    continue
            results[name][tool] = got
            print("%-16s %-5s %14s %14s %14s %18s" % ((name, tool) + tuple(
                "%d/%d" % got[k] for k in KINDS)), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
