"""The Debian packages lode-mini's corpus is built from: which ones, at which versions, and how they
are fetched (`apt-get download` + `dpkg-deb -x`, no root install) into tools/mini/.cache.

Versions are pinned so that a rebuild reads the same bytes. Debian replaces security and point
releases in place, so a pinned version can disappear from the archive; then the candidate version is
used instead and a warning says so (the versions actually used go into OUT/manifest.json).
"""
import dataclasses
import hashlib
import pathlib
import shutil
import subprocess
import sys


@dataclasses.dataclass(frozen=True)
class Package:
    name: str
    version: str      # the pinned version (Debian 12 "bookworm")
    licence: str      # one line; tools/mini/LICENSES.md has the details
    role: str = "text"  # "text": corpus text; "tool": only a program used to read another package


PACKAGES = (
    Package("python3.11-doc", "3.11.2-6+deb12u9", "PSF-2.0 (Python Software Foundation License)"),
    Package("manpages", "6.03-2", "Linux-man-pages-copyleft, GPL-2+, BSD (per page)"),
    Package("manpages-dev", "6.03-2", "Linux-man-pages-copyleft, GPL-2+, BSD (per page)"),
    Package("bible-kjv-text", "4.38", "public domain text (KJV, 1611); packaging GPL-2+"),
    Package("bible-kjv", "4.38", "GPL-2+ (the reader program)", role="tool"),
    Package("fortunes", "1:1.99.1-7.3", "BSD-3-clause (fortune-mod)"),
    Package("fortunes-min", "1:1.99.1-7.3", "BSD-3-clause (fortune-mod)"),
    Package("debian-reference-en", "2.100", "GPL-2+"),
    Package("debian-handbook", "11.20220922", "GPL-2+ or CC-BY-SA-3.0"),
    Package("sqlite3-doc", "3.40.1-2+deb12u2", "public domain"),
)


@dataclasses.dataclass(frozen=True)
class Fetched:
    package: Package
    version: str            # the version actually downloaded
    root: pathlib.Path      # where the .deb was unpacked (its files under root/usr/...)
    deb_sha256: str


def _run(cmd, cwd):
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return result.returncode, result.stdout + result.stderr


def _download(package, debs):
    """Downloads the pinned version (else the candidate) into debs, unless there; returns the path."""
    output = ""
    for spec, version in ((f"{package.name}={package.version}", package.version), (package.name, None)):
        found = _find_deb(debs, package.name, version)
        if found:
            return found
        code, output = _run(["apt-get", "download", spec], debs)
        found = _find_deb(debs, package.name, version)
        if code == 0 and found:
            return found
    sys.exit(f"corpus: could not download {package.name}: {output.strip()[-400:]}\n"
             "Run 'apt-get update' first (the package lists may be missing or stale).")


def _deb_version(deb):
    return subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True,
                          check=True).stdout.strip()


def _find_deb(debs, name, version):
    # apt-get download writes NAME_VERSION_ARCH.deb with ':' in the version as '%3a'.
    for deb in sorted(debs.glob(f"{name}_*.deb")):
        if version is None or _deb_version(deb) == version:
            return deb
    return None


def fetch(cache):
    """Downloads and unpacks every package; returns {name: Fetched}. Idempotent."""
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        sys.exit("corpus: needs apt-get and dpkg-deb (a Debian or Ubuntu machine)")
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    fetched = {}
    for package in PACKAGES:
        deb = _download(package, debs)
        version = _deb_version(deb)
        if version != package.version:
            print(f"warning: {package.name} {package.version} is not in the archive any more; using "
                  f"{version} (update the pin in tools/mini/packages.py)", file=sys.stderr)
        root = cache / "root" / f"{package.name}_{version.replace(':', '%3a')}"
        if not (root / ".unpacked").exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
            (root / ".unpacked").write_text("ok\n")
        sha = hashlib.sha256(deb.read_bytes()).hexdigest()
        fetched[package.name] = Fetched(package, version, root, sha)
    return fetched
