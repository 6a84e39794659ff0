"""fsdp-cpp used as an installed library, the way another project uses it (docs/library.md).

    examples.py --work DIR --source SRC --cmake CMAKE STEP

One CTest fixture chain (tests/examples/CMakeLists.txt), each STEP one test:
  install   cmake --install of this build into DIR/prefix (a fresh prefix).
  build     every example of examples/ configured against DIR/prefix with only CMAKE_PREFIX_PATH
            set (not the build tree: nothing of it is on the include or library path), and the
            complete program of docs/library.md, extracted from the page, as a project of its own.
  package   the package's LibTorch lookup: Torch_DIR is honoured; a directory that is not LibTorch,
            a LibTorch of another version, and no LibTorch at all (the one it was built against gone,
            no python3 with torch on PATH) are refused with one clear error.
  doc       docs/library.md's program runs and trains; README.md's C++ lines are lines of it.
  vit, t5, custom_loop, c10d_backend
            the example at 1 process, and at 2 processes started by torchrun --no-python and by the
            library's own launcher (--nproc-per-node): the losses of every step equal within 1e-5
            (relative). vit also: activation checkpointing (equal) and bf16 mixed precision (close,
            not equal). custom_loop also: the full state dicts exported at 1 and 2 processes agree
            (1e-3 of each tensor's largest value: AdamW magnifies summation-order differences); a run
            stopped after 3 steps at 2 processes and resumed at 1 process matches steps 4..6 within
            1e-5, and resumed at 2 processes exports exactly the uninterrupted 2-process run's weights.
            c10d_backend also: the program's own ProcessGroupGloo carries the engine (named in its log), with
            HYBRID_SHARD's sub-groups and with a second backend for the reduce lane, losses equal within 1e-5.
Every step prints how long it took. Exit 0 pass, 1 fail.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

RTOL = 1e-5
RUN_TIMEOUT = 300


class Failed(Exception):
    pass


def run(cmd, timeout=RUN_TIMEOUT, env=None, cwd=None, expect_ok=True):
    """Runs cmd; returns (returncode, stdout + stderr). Raises Failed when expect_ok and it fails."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    try:
        p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)
    except subprocess.TimeoutExpired as e:
        raise Failed(f"timed out after {timeout} s: {' '.join(map(str, cmd))}\n{e.stdout or ''}{e.stderr or ''}")
    out = p.stdout + p.stderr
    if expect_ok and p.returncode != 0:
        raise Failed(f"exit {p.returncode}: {' '.join(map(str, cmd))}\n{out[-6000:]}")
    return p.returncode, out


def timed(what, fn):
    t = time.monotonic()
    result = fn()
    print(f"{what}: {time.monotonic() - t:.1f} s", flush=True)
    return result


# ---------------------------------------------------------------- install / build / package

def step_install(a):
    prefix = a.work / "prefix"
    shutil.rmtree(prefix, ignore_errors=True)
    timed("install", lambda: run([a.cmake, "--install", a.build, "--prefix", prefix]))
    config = prefix / "lib" / "cmake" / "fsdp_cpp"
    for f in ["fsdp_cppConfig.cmake", "fsdp_cppConfigVersion.cmake", "fsdp_cppTargets.cmake", "FsdpTorch.cmake"]:
        if not (config / f).is_file():
            raise Failed(f"the install has no {config / f}")
    for h in ["fsdp/all.h", "fsdp/fsdp.h", "fsdp/comm/process_group.h", "fsdp/optim/adamw.h",
              "fsdp/checkpoint/sharded.h", "fsdp/checkpoint/hf.h", "fsdp/train/trainer.h"]:
        if not (prefix / "include" / h).is_file():
            raise Failed(f"the install has no include/{h}")
    # Every header of the source tree's include/ is installed (a moved or added header too).
    missing = [str(p.relative_to(a.source / "include")) for p in (a.source / "include").rglob("*.h")
               if not (prefix / "include" / p.relative_to(a.source / "include")).is_file()]
    if missing:
        raise Failed(f"headers not installed: {missing}")
    # Nothing installed names the build tree: the package must work with it gone, and a program
    # linked against it must never load a file of the tree it was built in (issue 50: the
    # installed libfsdp_data.a named the build tree's libfsdp_spm_shim.so). Every file, the
    # libraries' bytes included.
    tree = str(Path(a.build).resolve()).encode()
    for f in sorted(p for p in prefix.rglob("*") if p.is_file()):
        if tree in f.read_bytes():
            raise Failed(f"{f} names the build tree {a.build}")
    print(f"installed to {prefix}")


def extract_doc_program(source):
    """The complete program of docs/library.md: its first ```cpp block that has a main()."""
    text = (source / "docs" / "library.md").read_text()
    for block in re.findall(r"```cpp\n(.*?)```", text, flags=re.S):
        if "int main(" in block:
            return block
    raise Failed("docs/library.md has no ```cpp block with an int main(: the page's complete program is gone")


DOC_PROJECT = """cmake_minimum_required(VERSION 3.18)
project(doc_example LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
if(NOT CMAKE_BUILD_TYPE)
  set(CMAKE_BUILD_TYPE Release)
endif()
find_package(fsdp_cpp CONFIG REQUIRED)
add_executable(doc_example main.cpp)
target_link_libraries(doc_example PRIVATE fsdp::fsdp)
"""


def configure_and_build(a, src, build, jobs=2):
    shutil.rmtree(build, ignore_errors=True)
    # Only CMAKE_PREFIX_PATH: what a user of the installed package passes.
    timed(f"configure {src.name}", lambda: run([a.cmake, "-S", src, "-B", build, f"-DCMAKE_PREFIX_PATH={a.work / 'prefix'}"]))
    timed(f"build {src.name}", lambda: run([a.cmake, "--build", build, "-j", str(jobs)], timeout=1200))


def step_build(a):
    doc = a.work / "doc_example"
    shutil.rmtree(doc, ignore_errors=True)
    doc.mkdir(parents=True)
    (doc / "main.cpp").write_text(extract_doc_program(a.source))
    (doc / "CMakeLists.txt").write_text(DOC_PROJECT)
    configure_and_build(a, a.source / "examples", a.work / "build-examples")
    configure_and_build(a, doc, a.work / "build-doc")
    # The programs were compiled against the installed headers, not the source tree's.
    for cc in [a.work / "build-examples", a.work / "build-doc"]:
        for f in cc.rglob("flags.make"):
            if str(a.source / "include") in f.read_text() or str(a.source / "src") in f.read_text():
                raise Failed(f"{f} compiles against the source tree")


def step_package(a):
    """The LibTorch lookup of the installed package, configure only."""
    consumer = a.work / "package_consumer"
    shutil.rmtree(consumer, ignore_errors=True)
    consumer.mkdir(parents=True)
    (consumer / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(consumer LANGUAGES CXX)\n"
        "find_package(fsdp_cpp CONFIG REQUIRED)\nmessage(STATUS \"fsdp_cpp LibTorch: ${fsdp_cpp_TORCH_DIR}\")\n")
    prefix = f"-DCMAKE_PREFIX_PATH={a.work / 'prefix'}"

    def configure(*extra, ok):
        build = consumer / "build"
        shutil.rmtree(build, ignore_errors=True)
        rc, out = run([a.cmake, "-S", consumer, "-B", build, prefix, *extra], expect_ok=False)
        if (rc == 0) != ok:
            raise Failed(f"configure {' '.join(extra) or '(no options)'}: expected {'success' if ok else 'failure'}, "
                         f"got exit {rc}:\n{out[-3000:]}")
        return out

    out = configure(ok=True)
    torch_dir = re.search(r"fsdp_cpp LibTorch: (\S+)", out).group(1)
    print(f"default: LibTorch at {torch_dir}")
    # Torch_DIR, as find_package(Torch) takes it, wins over the one the package was built with.
    alias = consumer / "torch-alias"
    alias.symlink_to(torch_dir, target_is_directory=True)
    out = configure(f"-DTorch_DIR={alias}/share/cmake/Torch", ok=True)
    if f"fsdp_cpp LibTorch: {alias}" not in out:
        raise Failed(f"-DTorch_DIR={alias}/share/cmake/Torch was not used:\n{out[-2000:]}")
    print("Torch_DIR: used")
    # The same on a machine without a CUDA toolkit (a fresh Debian root has no /usr/local/cuda): a CUDA
    # build's package finds the wheel's CUDA runtime beside the real torch directory, not beside the
    # alias (issue 39: FSDP_CUDA_RUNTIME_INCLUDE-NOTFOUND). Here the toolkit is hidden for the configure.
    toolkits = sorted(str(d) for d in Path("/usr/local").glob("cuda*") if d.is_dir())
    if toolkits and os.geteuid() == 0 and shutil.which("unshare"):
        build = consumer / "build"
        shutil.rmtree(build, ignore_errors=True)
        hide = "; ".join(f"mount -t tmpfs none {shlex.quote(d)}" for d in toolkits)
        configure_cmd = shlex.join([str(a.cmake), "-S", str(consumer), "-B", str(build), prefix,
                                    f"-DTorch_DIR={alias}/share/cmake/Torch"])
        env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "NCCL_HOME")}
        p = subprocess.run(["unshare", "-m", "sh", "-c", f"{hide} && exec {configure_cmd}"], capture_output=True,
                           text=True, timeout=RUN_TIMEOUT, env=env)
        if p.returncode != 0 or f"fsdp_cpp LibTorch: {alias}" not in p.stdout + p.stderr:
            raise Failed(f"-DTorch_DIR through a link, no CUDA toolkit on the machine ({', '.join(toolkits)} "
                         f"hidden): exit {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")
        print(f"Torch_DIR through a link without {', '.join(toolkits)}: used")
    elif toolkits:
        print(f"note: {', '.join(toolkits)} could not be hidden (needs root and unshare): the configure above "
              "may have found the toolkit instead of the wheel's runtime")
    # Not LibTorch: one clear error naming the directory.
    out = " ".join(configure(f"-DFSDP_TORCH_DIR={consumer / 'nowhere'}", ok=False).split())  # CMake wraps lines
    if "is not a torch 2.x package" not in out or str(consumer / "nowhere") not in out:
        raise Failed(f"a directory that is not LibTorch: unclear error:\n{out[-2000:]}")
    print("not LibTorch: refused")
    # Another version: refused, naming both.
    other = consumer / "torch-2.1"
    (other / "include" / "torch" / "headeronly").mkdir(parents=True)
    (other / "include" / "torch" / "headeronly" / "version.h").write_text(
        "#define TORCH_VERSION_MAJOR 2\n#define TORCH_VERSION_MINOR 1\n#define TORCH_VERSION_PATCH 0\n")
    (other / "lib").mkdir()
    (other / "lib" / "libtorch_cpu.so").write_text("")
    out = configure(f"-DFSDP_TORCH_DIR={other}", ok=False)
    if not re.search(r"LibTorch 2\.1 at .*but fsdp_cpp was built against LibTorch 2\.\d+", " ".join(out.split())):
        raise Failed(f"a LibTorch of another version: unclear error:\n{out[-2000:]}")
    print("another LibTorch version: refused")
    # None at all: the LibTorch it was built against gone, no python3 with torch on PATH.
    moved = consumer / "prefix-moved"
    shutil.copytree(a.work / "prefix", moved)
    config = moved / "lib" / "cmake" / "fsdp_cpp" / "fsdp_cppConfig.cmake"
    text = config.read_text()
    built = re.search(r'set\(FSDP_TORCH_BUILT_DIR "([^"]*)"\)', text).group(1)
    config.write_text(text.replace(built, str(consumer / "gone" / "torch")))
    venv_bin = str(Path(a.python).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    build = consumer / "build"
    shutil.rmtree(build, ignore_errors=True)
    rc, out = run([a.cmake, "-S", consumer, "-B", build, f"-DCMAKE_PREFIX_PATH={moved}"], env={"PATH": path},
                  expect_ok=False)
    flat = " ".join(out.split())
    if rc == 0 or "no LibTorch found. Tried:" not in flat or f"{consumer / 'gone' / 'torch'} (gone)" not in flat:
        raise Failed(f"no LibTorch anywhere: expected one error listing what was tried, got exit {rc}:\n{out[-2000:]}")
    print("no LibTorch anywhere: refused, naming what was tried")


# ---------------------------------------------------------------- runs

def exe(a, name):
    return a.work / "build-examples" / name / name


def torchrun(a):
    t = Path(a.python).parent / "torchrun"
    if not t.exists():
        raise Failed(f"no torchrun beside {a.python} (the project's Python environment: scripts/venv.sh)")
    return t


# Two processes share two cores with other tests: one thread each keeps runs short and steady.
RUN_ENV = {"OMP_NUM_THREADS": "1"}


def launch(a, how, program, args):
    """Runs an example at one process ("single"), or at two by "launcher" or "torchrun"."""
    args = [str(x) for x in args]
    if how == "single":
        cmd = [program, *args]
    elif how == "launcher":
        cmd = [program, *args, "--nproc-per-node", "2"]
    else:
        cmd = [torchrun(a), "--no-python", "--standalone", "--nproc-per-node", "2", program, *args]
    t = time.monotonic()
    _, out = run(cmd, env=RUN_ENV)
    print(f"  {how:8} {' '.join(args)}: {time.monotonic() - t:.1f} s", flush=True)
    return out


STEP = re.compile(r"^step (\d+) loss (\S+) grad_norm (\S+)", re.M)


def steps_of(out):
    s = {int(m.group(1)): (float(m.group(2)), float(m.group(3))) for m in STEP.finditer(out)}
    if not s:
        raise Failed(f"no 'step N loss X grad_norm Y' line in:\n{out[-3000:]}")
    return s


def compare(name, ref, other, rtol=RTOL, want_steps=None):
    """Worst relative difference of loss and grad norm over the steps of `other`; Failed above rtol."""
    want = want_steps or sorted(ref)
    if sorted(other) != list(want):
        raise Failed(f"{name}: steps {sorted(other)}, expected {list(want)}")
    worst = 0.0
    for s in want:
        for r, o in zip(ref[s], other[s]):
            worst = max(worst, abs(r - o) / max(abs(r), 1e-12))
    line = f"  {name}: worst relative difference {worst:.2e} over steps {want[0]}..{want[-1]}"
    print(line, flush=True)
    if not worst <= rtol:
        raise Failed(f"{line} > {rtol:g}\n  reference {ref}\n  this      {other}")
    return worst


def learned(steps, factor):
    """The mean loss of the last 5 steps is below `factor` times the first step's."""
    n = max(steps)
    first, last = steps[1][0], sum(steps[s][0] for s in range(n - 4, n + 1)) / 5
    print(f"  {n} steps: loss {first:.4f} -> {last:.4f} (mean of the last 5)")
    if not last < factor * first:
        raise Failed(f"did not learn in {n} steps: loss {first} -> {last}, expected below {factor} x {first}")


def step_vit(a):
    p = exe(a, "vit")
    args = ["--steps", "4", "--batch", "16"]
    ref = steps_of(launch(a, "single", p, args))
    compare("2 processes (launcher)", ref, steps_of(launch(a, "launcher", p, args)))
    out = launch(a, "torchrun", p, [*args, "--activation-checkpointing"])
    if "5 units (4 checkpointed)" not in out:
        raise Failed(f"--activation-checkpointing: expected '5 units (4 checkpointed)':\n{out[-2000:]}")
    compare("2 processes (torchrun), activation checkpointing", ref, steps_of(out))
    out = launch(a, "launcher", p, [*args, "--precision", "bf16"])
    if "precision bf16" not in out:
        raise Failed(f"--precision bf16 not reported:\n{out[-2000:]}")
    bf16 = steps_of(out)
    # bf16 parameters and activations: close to fp32, and not equal (then mixed precision was not on).
    worst = compare("2 processes, bf16 mixed precision vs fp32", ref, bf16, rtol=5e-2)
    if worst < 1e-6:
        raise Failed("bf16 run equals the fp32 run: mixed precision did not take effect")
    # It learns: 4 classes, chance is ln 4 = 1.386; after 60 steps the loss is far below.
    learned(steps_of(launch(a, "single", p, ["--steps", "60", "--batch", "32"])), 0.6)


def step_t5(a):
    p = exe(a, "t5")
    args = ["--steps", "4", "--batch", "16"]
    ref = steps_of(launch(a, "single", p, args))
    compare("2 processes (launcher)", ref, steps_of(launch(a, "launcher", p, args)))
    compare("2 processes (torchrun)", ref, steps_of(launch(a, "torchrun", p, args)))
    out = launch(a, "single", p, ["--steps", "60", "--batch", "32", "--show", "2"])
    learned(steps_of(out), 0.6)
    if not re.search(r"reversed \d+ of 2 correctly", out):
        raise Failed(f"--show 2 printed no result:\n{out[-2000:]}")


def read_safetensors(path):
    """{name: numpy array} through the safetensors library (what PyTorch users load it with)."""
    from safetensors.numpy import load_file
    return load_file(str(path))


def compare_states(name, ref, other, tol):
    """Worst difference of the tensors, relative to each tensor's largest value; Failed above tol."""
    import numpy as np
    if sorted(ref) != sorted(other):
        raise Failed(f"{name}: tensors differ: {sorted(set(ref) ^ set(other))}")
    worst, where = 0.0, ""
    for k in ref:
        if ref[k].shape != other[k].shape or ref[k].dtype != np.float32:
            raise Failed(f"{name}: {k} is {other[k].dtype}{other[k].shape}, expected float32{ref[k].shape}")
        scale = max(float(np.abs(ref[k]).max()), 1e-12)
        d = float(np.abs(ref[k].astype(np.float64) - other[k]).max()) / scale
        if d > worst:
            worst, where = d, k
    line = f"  {name}: {len(ref)} tensors, worst difference {worst:.2e} of the tensor's largest value ({where})"
    print(line)
    if not worst <= tol:
        raise Failed(f"{line} > {tol:g}")


def step_custom_loop(a):
    p = exe(a, "custom_loop")
    runs = a.work / "runs" / "custom_loop"
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir(parents=True)
    args = ["--steps", "6", "--batch", "16", "--grad-accum", "2"]
    ref = steps_of(launch(a, "single", p, [*args, "--export", runs / "one.safetensors"]))
    one = read_safetensors(runs / "one.safetensors")
    if not any(k.startswith("blocks.3.") for k in one) or "proj_in.weight" not in one:
        raise Failed(f"the export lacks parameters: {sorted(one)}")
    compare("2 processes (launcher)", ref, steps_of(launch(a, "launcher", p, [*args, "--export", runs / "two.safetensors"])))
    two = read_safetensors(runs / "two.safetensors")
    # Across world sizes the gradients' summation order differs (~1e-7), and AdamW's m / sqrt(v) turns
    # that into larger differences where a gradient is near zero: the weights agree to 1e-3, not 1e-5.
    compare_states("export, 2 processes vs 1", one, two, 1e-3)
    # Interrupted after 3 steps at 2 processes (torchrun)...
    ckpt = runs / "ckpt"
    first = steps_of(launch(a, "torchrun", p, [*args, "--checkpoint-dir", ckpt, "--stop-after", "3"]))
    compare("2 processes (torchrun), steps 1..3", ref, first, want_steps=[1, 2, 3])
    if not (ckpt / "step_00000003" / "manifest.json").is_file():
        raise Failed(f"no checkpoint step_00000003 in {ckpt}: {sorted(os.listdir(ckpt))}")
    shutil.copytree(ckpt, runs / "ckpt-copy")
    # ...resumed at 1 process (the shards re-cut) for steps 4..6,
    out = launch(a, "single", p, [*args, "--checkpoint-dir", ckpt, "--resume", "--export", runs / "resumed1.safetensors"])
    if "resumed from" not in out:
        raise Failed(f"--resume did not resume:\n{out[-2000:]}")
    compare("resumed at 1 process, steps 4..6", ref, steps_of(out), want_steps=[4, 5, 6])
    compare_states("export resumed at 1 process vs uninterrupted at 1", one, read_safetensors(runs / "resumed1.safetensors"), 1e-3)
    # ...and at 2 processes: the same computation as the uninterrupted 2-process run, so the same
    # bits: the checkpoint round trip loses nothing (parameters, AdamW moments, step count).
    out = launch(a, "launcher", p, [*args, "--checkpoint-dir", runs / "ckpt-copy", "--resume",
                                    "--export", runs / "resumed2.safetensors"])
    compare("resumed at 2 processes, steps 4..6", ref, steps_of(out), want_steps=[4, 5, 6])
    compare_states("export resumed at 2 processes vs uninterrupted at 2", two, read_safetensors(runs / "resumed2.safetensors"), 0.0)


def step_c10d_backend(a):
    p = exe(a, "c10d_backend")
    args = ["--steps", "6"]
    ref = steps_of(launch(a, "single", p, args))
    out = launch(a, "torchrun", p, args)
    if "process group: c10d-gloo (c10d gloo; one backend for both lanes" not in out:
        raise Failed(f"the program's ProcessGroupGloo is not named as the engine's group:\n{out[-2000:]}")
    compare("2 processes (torchrun), the program's ProcessGroupGloo", ref, steps_of(out))
    out = launch(a, "torchrun", p, [*args, "--hybrid", "--lanes", "2"])
    if "a backend per lane" not in out or "hybrid" not in out.lower():
        raise Failed(f"--hybrid --lanes 2 not reported:\n{out[-2000:]}")
    compare("2 processes (torchrun), HYBRID over sub-groups, a backend per lane", ref, steps_of(out))
    learned(steps_of(launch(a, "single", p, ["--steps", "40"])), 0.6)


def step_doc(a):
    readme = (a.source / "README.md").read_text()
    program = extract_doc_program(a.source)
    lines = [ln.strip() for ln in program.splitlines()]
    # README.md's C++ snippet is an excerpt of the page's program: each of its lines is one of the
    # program's, in order, so that it compiles and runs as written.
    blocks = re.findall(r"```cpp\n(.*?)```", readme, flags=re.S)
    if not blocks:
        raise Failed("README.md has no ```cpp block")
    for block in blocks:
        at = 0
        for ln in (x.strip() for x in block.splitlines()):
            if not ln:
                continue
            try:
                at = lines.index(ln, at) + 1
            except ValueError:
                raise Failed(f"README.md's C++ line {ln!r} is not a line of docs/library.md's program "
                             f"(in this order): make them agree")
    print(f"README.md's C++ lines ({sum(len(b.splitlines()) for b in blocks)}) are lines of docs/library.md's program")
    p = a.work / "build-doc" / "doc_example"
    for how in ["single", "launcher" if "launch_self" in program else "torchrun"]:
        out = launch(a, how, p, [])
        m = re.search(r"loss ([0-9.eE+-]+) -> ([0-9.eE+-]+)", out)
        if not m:
            raise Failed(f"docs/library.md's program printed no 'loss A -> B':\n{out[-2000:]}")
        first, last = float(m.group(1)), float(m.group(2))
        print(f"  loss {first:.4f} -> {last:.4f}")
        if not last < 0.5 * first:
            raise Failed(f"docs/library.md's program did not train: loss {first} -> {last}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--cmake", required=True)
    ap.add_argument("--python", default=os.environ.get("FSDP_PYTHON", sys.executable))
    ap.add_argument("step", choices=["install", "build", "package", "doc", "vit", "t5", "custom_loop", "c10d_backend"])
    a = ap.parse_args()
    a.work = a.work.resolve()
    a.work.mkdir(parents=True, exist_ok=True)
    steps = {"install": step_install, "build": step_build, "package": step_package, "doc": step_doc,
             "vit": step_vit, "t5": step_t5, "custom_loop": step_custom_loop, "c10d_backend": step_c10d_backend}
    t = time.monotonic()
    try:
        steps[a.step](a)
    except Failed as e:
        print(f"FAILED ({a.step}): {e}", file=sys.stderr)
        return 1
    print(f"{a.step}: passed in {time.monotonic() - t:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
