"""Note [Gloo headers] (src/comm/gloo_backend.cpp), held to the binary.

The Gloo headers we compile against (Debian's libgloo-dev, a 2022 snapshot)
are not the Gloo that libtorch_cpu.so was built with. That is safe only while
they contribute declarations: no object of libfsdp_comm.a may define or
reference a symbol of Gloo's own — a Gloo function or method, an inline one
compiled here, or a vtable, typeinfo or VTT of a Gloo class — since any of
those would bind our code to the old headers' idea of a Gloo type. Gloo
types inside template arguments of the standard library's containers
(std::vector<std::shared_ptr<gloo::transport::Device>>) are fine: they are
pointers whose layout does not depend on Gloo's.

Usage: gloo_abi.py <libfsdp_comm.a> [nm]. Exit 0: clean; 1: the symbols found.
"""
import re
import subprocess
import sys


def strip_templates(name):
    """The demangled name with every <...> argument list removed."""
    previous = None
    while previous != name:
        previous = name
        name = re.sub(r"<[^<>]*>", "", name)
    return name


def gloo_symbols(nm_lines):
    """(object, symbol) of every symbol that belongs to Gloo."""
    found = []
    member = "?"
    for line in nm_lines:
        if line.endswith(":") and not line.startswith(" "):
            member = line[:-1]
            continue
        parts = line.split(None, 2) if line[:1] != " " else ["", *line.split(None, 1)]
        if len(parts) < 3:
            continue
        symbol = parts[2]
        bare = strip_templates(symbol)
        if re.search(r"(^|[\s(,*&])(vtable for |typeinfo for |typeinfo name for |VTT for )?gloo::", bare):
            found.append((member, symbol))
    return found


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    nm = sys.argv[2] if len(sys.argv) > 2 else "nm"
    out = subprocess.run([nm, "-C", sys.argv[1]], check=True, capture_output=True, text=True).stdout
    lines = out.splitlines()
    if not any("gloo_backend" in l for l in lines):
        print(f"gloo_abi: {sys.argv[1]} has no gloo_backend object: not the library expected")
        return 1
    found = gloo_symbols(lines)
    # The check itself: a line of each kind it must catch, and one it must pass.
    probe = gloo_symbols([
        "x.o:",
        "                 U gloo::Context::setTimeout(std::chrono::duration<long, std::ratio<1l, 1000l> >)",
        "0000000000000000 V vtable for gloo::rendezvous::Store",
        "0000000000000000 W void std::vector<std::shared_ptr<gloo::transport::Device>, "
        "std::allocator<std::shared_ptr<gloo::transport::Device> > >::_M_realloc_insert<>(int)",
    ])
    if len(probe) != 2:
        print(f"gloo_abi: the check is broken: it found {probe}")
        return 1
    for member, symbol in found:
        print(f"gloo_abi: {member}: {symbol}")
    if found:
        print(f"gloo_abi: {len(found)} symbols of Gloo in {sys.argv[1]}: the 2022 headers would decide their ABI "
              "(Note [Gloo headers] in src/comm/gloo_backend.cpp)")
        return 1
    print(f"gloo_abi: no symbol of Gloo's in {len(lines)} lines of nm output")
    return 0


if __name__ == "__main__":
    sys.exit(main())
