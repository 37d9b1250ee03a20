#!/usr/bin/env python3
"""ptxdiff.py OLD_PKG_DIR NEW_PKG_DIR [ARCH [SOURCES]]: did a change to a kernel package (or to
<tk/device.cuh>) change its device code? Compiles every compile unit of both package directories with
NVRTC, as tk does (every other package file and <tk/device.cuh> as in-memory headers, the manifest's
options, variants expanded), and compares the PTX of each unit after normalising what carries no
meaning: comments, debug lines, register numbers, labels, the names of function-local shared arrays and
of file-internal symbols. Prints per unit: identical PTX; else the same sequence of floating-point,
shuffle, barrier and atomic instructions per function (integer index arithmetic scheduled
differently); else DIFF, leaving both normalised PTX files in $TMPDIR. ARCH defaults to sm_90;
SOURCES (comma-separated .cu names) limits the units. Needs NVRTC (TK_NVRTC names the library) and
the CUDA include directory (CUDA_HOME, default /usr/local/cuda).

Used for issue 16: every kernels-src package moved onto <tk/device.cuh> gave identical PTX or the same
float-op sequence, for sm_80 and sm_90:
    git archive <before> kernels-src | tar -x -C /tmp/old
    python3 jit/device/ptxdiff.py /tmp/old/kernels-src/softmax kernels-src/softmax sm_80"""
import ctypes, ctypes.util, glob, json, os, re, sys, tempfile

def load_nvrtc():
    names = [os.environ.get("TK_NVRTC")] + sorted(glob.glob("/usr/local/cuda*/lib*/libnvrtc.so.*"), reverse=True)
    names.append(ctypes.util.find_library("nvrtc"))
    for n in names:
        if n and not n.endswith((".alt.so", "builtins.so")) and "builtins" not in n:
            try:
                return ctypes.CDLL(n)
            except OSError:
                pass
    sys.exit("ptxdiff: NVRTC not found (set TK_NVRTC)")

nv = load_nvrtc()
CUDA_INC = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")
TOOLKIT = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tk_device.cuh"), "rb").read()
TMP = tempfile.gettempdir()
CT = {"f32": "float", "f16": "__half", "bf16": "__nv_bfloat16", "f64": "double", "i8": "signed char",
      "u8": "unsigned char", "i32": "int", "i64": "long long", "fp8_e4m3": "__nv_fp8_e4m3", "fp8_e5m2": "__nv_fp8_e5m2"}
SZ = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i8": 1, "u8": 1, "i32": 4, "i64": 8, "fp8_e4m3": 1, "fp8_e5m2": 1}

def units(d, cc):
    """The compile units for compute capability cc, as tk forms them: the kernels that fit cc, grouped by
    source, options and arch-specific flag."""
    m = json.load(open(os.path.join(d, "kernel.json")))
    copts = m.get("compile", {}).get("options", [])
    u = {}
    for k in m["kernels"]:
        cons = k.get("constraints", {})
        if not cons.get("min_cc", 0) <= cc <= cons.get("max_cc", 1 << 30):
            continue
        dts = k.get("dtypes") or [None]
        for dt in dts:
            sym = k["symbol"]
            if dt:
                sym = sym.replace("{T}", CT[dt]).replace("{dtype}", dt).replace("{size}", str(SZ[dt])).replace("{vec}", str(16 // SZ[dt]))
            key = (k["source"], tuple(copts + k.get("options", [])), bool(k.get("constraints", {}).get("arch_specific")))
            u.setdefault(key, []).append(sym)
    return u

def compile_unit(d, src, opts, names, arch):
    files = {}
    for root, _, fs in os.walk(d):
        for f in fs:
            if f.endswith((".cu", ".cuh", ".h")):
                rel = os.path.relpath(os.path.join(root, f), d)
                files[rel] = open(os.path.join(root, f), "rb").read()
    hdrs = [(p, b) for p, b in files.items() if p != src] + [("tk/device.cuh", TOOLKIT)]
    prog = ctypes.c_void_p()
    H = (ctypes.c_char_p * len(hdrs))(*[b for _, b in hdrs])
    N = (ctypes.c_char_p * len(hdrs))(*[p.encode() for p, _ in hdrs])
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), files[src], src.encode(), len(hdrs), H, N) == 0
    for n in names:
        assert nv.nvrtcAddNameExpression(prog, n.encode()) == 0
    o = list(opts) + ["--gpu-architecture=" + arch, "-default-device", "-I" + CUDA_INC]
    O = (ctypes.c_char_p * len(o))(*[x.encode() for x in o])
    r = nv.nvrtcCompileProgram(prog, len(o), O)
    if r != 0:
        n = ctypes.c_size_t(); nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value); nv.nvrtcGetProgramLog(prog, log)
        sys.exit("%s: compile failed:\n%s" % (src, log.value.decode()))
    n = ctypes.c_size_t(); nv.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value); nv.nvrtcGetPTX(prog, ptx)
    text = ptx.value.decode()
    lines = [l for l in text.splitlines() if not l.strip().startswith(("//", ".loc", ".file", ".reg")) and l.strip()
             and not re.match(r"\.global \.align 4 \.u32 _ZN\w*3VecI", l)]
    out, regs = [], {}
    for l in lines:
        if l.startswith((".visible .entry", ".entry", ".func", ".visible .func")):
            regs = {}
        def ren(m):
            k = m.group(0)
            if k not in regs:
                regs[k] = "%%%s%d" % (m.group(1), len([x for x in regs if x.startswith("%" + m.group(1))]))
            return regs[k]
        l = re.sub(r"%([a-z]+)(\d+)", ren, l)
        l = re.sub(r"\$L__BB\d+_\d+", "$L", l)
        l = re.sub(r"_cu_[0-9a-f]{8}_", "_cu_H_", l)
        l = re.sub(r"^\s*\{\s*(.*;)\s*\}\s*$", r"\t\1", l)
        l = re.sub(r"_ZZ\w*?E(\d+)([A-Za-z_]\w*)", lambda m: "LOCAL_" + m.group(2), l)
        out.append(l)
    return "\n".join(out)

old, new = sys.argv[1], sys.argv[2]
arch = sys.argv[3] if len(sys.argv) > 3 else "sm_90"
cc = int(re.sub(r"\D", "", arch))
uo, un = units(old, cc), units(new, cc)
same = diff = fsame = 0
FOP = re.compile(r"^\s*(@%\w+\s+)?([a-z][\w.]*)")
def fops(text):
    """Per function, the sequence of floating-point (conversions included), shuffle, barrier and atomic
    opcodes: what decides the numbers (integer index arithmetic may be scheduled differently)."""
    out = []
    for l in text.splitlines():
        if l.startswith((".visible .entry", ".entry", ".func", ".visible .func")):
            out.append(l.split("(")[0])
            continue
        m = FOP.match(l)
        if not m:
            continue
        op = m.group(2)
        if re.search(r"\.(f16|bf16|f32|f64|f16x2|bf16x2)\b", op) or op.startswith(("shfl", "bar", "ex2", "lg2", "rcp", "sqrt", "fma", "mma", "wgmma", "atom", "red")):
            out.append(op)
    return out
only = sys.argv[4].split(",") if len(sys.argv) > 4 else None
for key, names in un.items():
    src, opts, archsp = key
    if only and src not in only:
        continue
    a = arch + ("a" if archsp and arch == "sm_90" else "")
    pn = compile_unit(new, src, opts, names, a)
    okey = key if key in uo else None
    if okey is None:
        print("NEW-ONLY", key); diff += 1; continue
    po = compile_unit(old, src, opts, names, a)
    if po != pn:
        for tag, text in (("old", po), ("new", pn)):
            with open(os.path.join(TMP, "%s.%s.ptx" % (os.path.basename(src), tag)), "w") as f:
                f.write(text)
    if po == pn:
        same += 1
    elif fops(po) == fops(pn):
        fsame += 1
    else:
        diff += 1
        print("DIFF %s %s (%d names): %s/%s.{old,new}.ptx" % (src, " ".join(opts), len(names), TMP,
                                                            os.path.basename(src)))
print("%s %s: %d units identical PTX, %d the same float/shuffle/barrier sequence, %d differ" % (new, arch, same, fsame,
                                                                                           diff))
sys.exit(1 if diff else 0)
