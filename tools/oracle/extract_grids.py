#!/usr/bin/env python3
"""Reads the lookup grids of ggml's grid i-quants out of the oracle library and prints them as C++.

The grids (and the 7-bit -> 8-bit sign table) are data, not code: lode's dequantizers must index
exactly the tables ggml indexes. They are taken from the symbol table of the oracle's
libggml-base.so (the npm build that tools/oracle/fetch downloads; it is not stripped), so nothing
is typed in by hand.

Usage (python3, standard library only), from the repository root:
    python3 tools/oracle/extract_grids.py "$(tools/oracle/fetch)/libggml-base.so" > src/core/quant/iq_grids.cpp

Before printing, the tables are checked against what the formats promise (every grid byte is one
of the format's few magnitudes, sign patterns have even parity) and against the compact integer
grids that ggml's quantizers keep in the same library, decoded independently. Any mismatch stops
the script with a message and prints nothing.
"""
import ctypes
import os
import struct
import sys

# (symbol, C element type, element count), in the order they are written out; src/core/quant/
# iq_grids.h declares the same names and sizes.
TABLES = [
    ("iq2xxs_grid", "uint64_t", 256),
    ("iq2xs_grid", "uint64_t", 512),
    ("iq2s_grid", "uint64_t", 1024),
    ("iq3xxs_grid", "uint32_t", 256),
    ("iq3s_grid", "uint32_t", 512),
    ("iq1s_grid", "uint64_t", 2048),
    ("ksigns_iq2xs", "uint8_t", 128),
]

# ggml's quantizers keep each grid as a function-local table of uint16 codes: 2 bits per value
# for the 8-value grids, 3 bits per value for the 4-value ones. The compiler names such a static
# "name.N", so these are matched by prefix.
COMPACT_GRIDS = [
    # (grid, compact symbol prefix, bits per value, values per entry, value of each code)
    ("iq2xxs_grid", "kgrid_2bit_256", 2, 8, {0: 8, 1: 25, 2: 43}),
    ("iq2xs_grid", "kgrid_2bit_512", 2, 8, {0: 8, 1: 25, 2: 43}),
    ("iq2s_grid", "kgrid_2bit_1024", 2, 8, {0: 8, 1: 25, 2: 43}),
    ("iq1s_grid", "kgrid_1bit_2048", 2, 8, {0: -1, 1: 0, 2: 1}),
    ("iq3xxs_grid", "kgrid_256", 3, 4, dict(enumerate([4, 12, 20, 28, 36, 44, 52, 62]))),
    ("iq3s_grid", "kgrid_512", 3, 4, {code: 2 * code + 1 for code in range(8)}),
]

C_TYPE_BYTES = {"uint8_t": 1, "uint32_t": 4, "uint64_t": 8}


def die(message):
    sys.exit(f"extract_grids: {message}")


class Elf64:
    """Just enough ELF64 (little-endian) to find a symbol's bytes: section headers and .symtab."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.data = f.read()
        if self.data[:4] != b"\x7fELF" or self.data[4] != 2 or self.data[5] != 1:
            die(f"{path} is not a little-endian ELF64 file")
        shoff, = struct.unpack_from("<Q", self.data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", self.data, 0x3A)
        self.sections = [self._section(shoff + i * shentsize) for i in range(shnum)]
        names = self.sections[shstrndx]
        for section in self.sections:
            section["name"] = self._string(names["offset"], section["name_index"])
        self.symbols = self._symbols(path)

    def _section(self, at):
        (name_index, kind, _flags, addr, offset, size, link, _info, _align, entsize) = struct.unpack_from(
            "<IIQQQQIIQQ", self.data, at)
        return {"name_index": name_index, "type": kind, "addr": addr, "offset": offset, "size": size,
                "link": link, "entsize": entsize}

    def _string(self, table_offset, index):
        start = table_offset + index
        return self.data[start:self.data.index(b"\0", start)].decode("ascii", "replace")

    def _symbols(self, path):
        SHT_SYMTAB = 2
        symtab = next((s for s in self.sections if s["type"] == SHT_SYMTAB), None)
        if symtab is None:
            die(f"{path} has no .symtab (stripped?): use the unstripped oracle build from tools/oracle/fetch")
        strtab = self.sections[symtab["link"]]
        symbols = {}
        for at in range(symtab["offset"], symtab["offset"] + symtab["size"], symtab["entsize"]):
            name_index, _info, _other, shndx, value, size = struct.unpack_from("<IBBHQQ", self.data, at)
            name = self._string(strtab["offset"], name_index)
            if name and 0 < shndx < len(self.sections):
                symbols[name] = (shndx, value, size)
        return symbols

    def find(self, name, prefix=False):
        """The name of the one symbol called `name` (or `name.N` when prefix is set)."""
        if not prefix:
            return name if name in self.symbols else None
        hits = [s for s in self.symbols if s == name or s.startswith(name + ".")]
        if len(hits) > 1:
            die(f"more than one symbol looks like {name}: {sorted(hits)}")
        return hits[0] if hits else None

    def read(self, name):
        """The bytes of a data symbol: its address mapped to a file offset through its section."""
        shndx, value, size = self.symbols[name]
        section = self.sections[shndx]
        SHT_NOBITS = 8
        if section["type"] == SHT_NOBITS:
            die(f"{name} lives in {section['name']}, which has no bytes in the file")
        if not (section["addr"] <= value and value + size <= section["addr"] + section["size"]):
            die(f"{name} does not lie inside its section {section['name']}")
        start = section["offset"] + (value - section["addr"])
        return self.data[start:start + size]


def read_tables(elf):
    tables = {}
    for name, c_type, count in TABLES:
        if elf.find(name) is None:
            die(f"symbol {name} not found: is this ggml's libggml-base.so?")
        raw = elf.read(name)
        width = C_TYPE_BYTES[c_type]
        if len(raw) != width * count:
            die(f"{name} is {len(raw)} bytes, expected {count} x {c_type} = {width * count}: ggml's "
                f"layout changed; update TABLES and iq_grids.h together")
        tables[name] = [int.from_bytes(raw[i * width:(i + 1) * width], "little") for i in range(count)]
    return tables


def entry_bytes(entry, n, signed=False):
    """The n values packed in a grid entry, value j in byte j; as int8 when signed."""
    return [b - 256 if signed and b > 127 else b for b in entry.to_bytes(n, "little")]


def check_magnitudes(tables):
    """Every grid byte is one of the few magnitudes its format can encode."""
    allowed = {
        "iq2xxs_grid": (8, False, {8, 25, 43}),
        "iq2xs_grid": (8, False, {8, 25, 43}),
        "iq2s_grid": (8, False, {8, 25, 43}),
        "iq1s_grid": (8, True, {-1, 0, 1}),
        "iq3s_grid": (4, False, {1, 3, 5, 7, 9, 11, 13, 15}),
        # iq3_xxs's magnitudes are not evenly spaced; its largest is 62, not 60.
        "iq3xxs_grid": (4, False, {4, 12, 20, 28, 36, 44, 52, 62}),
    }
    for name, (width, signed, values) in allowed.items():
        for i, entry in enumerate(tables[name]):
            got = set(entry_bytes(entry, width, signed))
            if not got <= values:
                die(f"{name}[{i}] = {entry:#x} has bytes {sorted(got - values)} outside {sorted(values)}")
        if len(set(tables[name])) != len(tables[name]):
            die(f"{name} has repeated entries")


def check_signs(table):
    """Sign pattern i keeps the 7 bits of i and sets bit 7 so that the count of minus signs is even."""
    for i, pattern in enumerate(table):
        if pattern & 0x7F != i or bin(pattern).count("1") % 2 != 0:
            die(f"ksigns_iq2xs[{i}] = {pattern:#04x} is not i with even parity")


def check_against_compact_grids(elf, tables):
    """Decode the quantizers' uint16 codes independently; they must give the very same grids."""
    for grid, prefix, bits, n_values, value_of in COMPACT_GRIDS:
        symbol = elf.find(prefix, prefix=True)
        if symbol is None:
            die(f"no {prefix}.* symbol to cross-check {grid} against")
        raw = elf.read(symbol)
        codes = [int.from_bytes(raw[i:i + 2], "little") for i in range(0, len(raw), 2)]
        if len(codes) != len(tables[grid]):
            die(f"{symbol} has {len(codes)} entries but {grid} has {len(tables[grid])}")
        width = 8 if n_values == 8 else 4
        for i, (code, entry) in enumerate(zip(codes, tables[grid])):
            mask = (1 << bits) - 1
            expected = [value_of.get((code >> (bits * k)) & mask) for k in range(n_values)]
            if expected != entry_bytes(entry, width, signed=grid == "iq1s_grid"):
                die(f"{grid}[{i}] = {entry:#x} disagrees with {symbol}[{i}] = {code}")


def ggml_version(lib):
    """ggml's own version and commit, asked of the library itself; unknown if it will not load here."""
    try:
        ggml = ctypes.CDLL(os.path.abspath(lib))
        ggml.ggml_version.restype = ctypes.c_char_p
        ggml.ggml_commit.restype = ctypes.c_char_p
        return f"ggml {ggml.ggml_version().decode()} (commit {ggml.ggml_commit().decode()})"
    except (OSError, AttributeError):
        return "ggml (version unknown: the library did not load on this machine)"


def format_table(name, c_type, values):
    digits = 2 * C_TYPE_BYTES[c_type]
    per_line = {1: 16, 4: 8, 8: 4}[C_TYPE_BYTES[c_type]]
    lines = []
    for i in range(0, len(values), per_line):
        lines.append("    " + " ".join(f"0x{v:0{digits}x}," for v in values[i:i + per_line]))
    return f"const {c_type} {name}[{len(values)}] = {{\n" + "\n".join(lines) + "\n};\n"


def main():
    if len(sys.argv) != 2:
        die("usage: extract_grids.py PATH/TO/libggml-base.so > src/core/quant/iq_grids.cpp\n"
            "(the library is the oracle build that tools/oracle/fetch downloads)")
    lib = sys.argv[1]
    elf = Elf64(lib)
    tables = read_tables(elf)
    check_magnitudes(tables)
    check_signs(tables["ksigns_iq2xs"])
    check_against_compact_grids(elf, tables)

    out = [
        "// GENERATED by tools/oracle/extract_grids.py -- do not edit by hand.",
        f"// Source: the .symtab data symbols of {os.path.basename(lib)}, {ggml_version(lib)}: the CPU",
        "// build of ggml in the npm package that tools/oracle/fetch downloads (the oracle). Regenerate with:",
        "//   lib=\"$(tools/oracle/fetch)/libggml-base.so\"",
        "//   python3 tools/oracle/extract_grids.py \"$lib\" > src/core/quant/iq_grids.cpp",
        "// The script checks every table (magnitudes, sign parity, ggml's own compact grid codes) first.",
        '#include "core/quant/iq_grids.h"',
        "",
        "namespace lode::quant {",
        "",
    ]
    for name, c_type, _count in TABLES:
        out.append(format_table(name, c_type, tables[name]))
    out.append("}  // namespace lode::quant")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
