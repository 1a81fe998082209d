"""Delta's jars for Spark: the ones this project pins, and the session settings that load them
from a local directory.

`make install` fetches them once from Maven Central into the environment
(`python -m rollup_assets.resources.delta_jars DIR`: each file is checked against the size and
SHA-256 pinned here, and Maven's own `.sha1` of it). Every Spark session the project starts is then
given their local paths (`spark.jars`) with Delta's SQL extension and catalog. Starting a session
downloads nothing: a missing jar is an error naming it and the command that installs it.
"""

import hashlib
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rollup_assets.model.errors import DeltaJarsMissingError

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
INSTALL_COMMAND = "make install"


@dataclass(frozen=True)
class Jar:
    group: str
    artifact: str
    version: str
    size: int  # bytes
    sha256: str

    @property
    def file_name(self) -> str:
        return f"{self.artifact}-{self.version}.jar"

    @property
    def url(self) -> str:
        return f"{MAVEN_CENTRAL}/{self.group.replace('.', '/')}/{self.artifact}/{self.version}/"


# delta-spark's POM has two runtime dependencies that pyspark's own jars do not provide:
# delta-storage (the LogStore) and scala-library (pyspark ships 2.13.18, newer than the 2.13.17
# it names). Its delta-kernel and Unity Catalog dependencies serve catalog-managed tables only;
# path-based reads, MERGE, the change feed, deletion vectors and checkpoints run without them
# (tests/integration/test_delta_spark_interop.py). 4.4.0 is the newest release Maven Central
# serves for Spark 4.2, and the Python package delta-spark is pinned to the same release.
DELTA_JARS = (
    Jar(
        "io.delta",
        "delta-spark_4.2_2.13",
        "4.4.0",
        9_515_916,
        "27d4fd8b1f879535c573ed1c718177d6a27f24d3e626ba02e216369725721ead",
    ),
    Jar(
        "io.delta",
        "delta-storage",
        "4.4.0",
        113_863,
        "c46735481fa8e326b0957be02b4420cbcab4b325bb08009b7f2045a95133f1cc",
    ),
)


def jar_paths(directory: Path) -> list[Path]:
    """The pinned jars in `directory`; DeltaJarsMissingError naming the first one missing (or
    of the wrong size) and the command that installs it."""
    paths = []
    for jar in DELTA_JARS:
        path = directory / jar.file_name
        if not path.is_file() or path.stat().st_size != jar.size:
            found = "is not" if not path.is_file() else "is incomplete"
            raise DeltaJarsMissingError(
                f"Delta's jar {jar.file_name} {found} in {directory}: run `{INSTALL_COMMAND}` "
                f"(or `python -m rollup_assets.resources.delta_jars {directory}`), "
                "or point ROLLUPS_DELTA_JARS at the directory that holds Delta's jars"
            )
        paths.append(path)
    return paths


def delta_conf(directory: Path, conf: dict[str, str] | None = None) -> dict[str, str]:
    """Settings that load Delta into a session from `directory`, merged with `conf` (jars and
    SQL extensions it lists are kept, Delta's are added)."""
    conf = conf or {}
    jars = [j for j in conf.get("spark.jars", "").split(",") if j.strip()]
    jars += [str(p) for p in jar_paths(directory) if str(p) not in jars]
    extensions = [e for e in conf.get("spark.sql.extensions", "").split(",") if e.strip()]
    if DELTA_EXTENSION not in extensions:
        extensions.append(DELTA_EXTENSION)
    return {
        "spark.jars": ",".join(jars),
        "spark.sql.extensions": ",".join(extensions),
        "spark.sql.catalog.spark_catalog": conf.get(
            "spark.sql.catalog.spark_catalog", DELTA_CATALOG
        ),
    }


def has_delta(conf: dict[str, str]) -> bool:
    """Do these session settings load Delta's SQL extension?"""
    return DELTA_EXTENSION in conf.get("spark.sql.extensions", "").split(",")


def _sha(path: Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verified(path: Path, jar: Jar) -> bool:
    return path.is_file() and path.stat().st_size == jar.size and _sha(path, "sha256") == jar.sha256


def fetch(directory: Path, timeout_s: float = 120.0) -> list[str]:
    """Install step: download each pinned jar missing from `directory` (or not matching its
    pin), check it, and move it into place. Returns what it did, one line per jar."""
    directory.mkdir(parents=True, exist_ok=True)
    done = []
    for jar in DELTA_JARS:
        target = directory / jar.file_name
        if _verified(target, jar):
            done.append(f"{jar.file_name}: present")
            continue
        partial = target.with_suffix(".jar.part")
        url = jar.url + jar.file_name
        with urllib.request.urlopen(url, timeout=timeout_s) as r, partial.open("wb") as out:
            while block := r.read(1 << 20):
                out.write(block)
        with urllib.request.urlopen(url + ".sha1", timeout=timeout_s) as r:
            maven_sha1 = r.read().decode().split()[0].strip()
        if not _verified(partial, jar) or _sha(partial, "sha1") != maven_sha1:
            partial.unlink()
            raise DeltaJarsMissingError(
                f"{url} does not match its pinned size and SHA-256 (or Maven's .sha1); "
                "nothing was installed"
            )
        partial.replace(target)
        done.append(f"{jar.file_name}: fetched from {jar.url}")
    return done


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m rollup_assets.resources.delta_jars DIRECTORY")
    for line in fetch(Path(sys.argv[1])):
        print(line)
