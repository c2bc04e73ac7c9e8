"""Load ``compat/advisories.yaml``: published security advisories against the packages a stack
pins, each with the releases it affects (a PEP 440 specifier) and the first fixed release.

:func:`load_advisories` returns the rows as :class:`Advisory` records; :meth:`Advisory.affects`
says whether one release of one package is inside. A malformed row raises
:class:`~imgfab.errors.MatrixError` naming it (an unparsable range would silently match nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from imgfab.errors import MatrixError
from imgfab.matrix.records import Sourced, _read, _records, _sourced, _tuple, validate_record

SEVERITIES = ("low", "moderate", "high", "critical")


@dataclass(frozen=True)
class Advisory(Sourced):
    """One advisory, e.g. GHSA-2pc9-4j83-qjmr: vllm >=0.10.1,<0.14.0, fixed in 0.14.0."""

    id: str
    aliases: tuple[str, ...]
    package: str
    affected: str  # PEP 440 specifier of the releases inside it
    fixed: str
    severity: str
    cvss: str
    summary: str
    note: str = ""

    def affects(self, package: str, version: str) -> bool:
        """Whether ``package`` ``version`` is inside this advisory's affected range."""
        if package != self.package:
            return False
        return SpecifierSet(self.affected).contains(Version(version), prereleases=True)

    def named_in(self, ids: tuple[str, ...] | list[str]) -> bool:
        """Whether ``ids`` (a recipe's ``backend.accept_advisories``) name this advisory, by
        its id or one of its aliases."""
        return self.id in ids or any(alias in ids for alias in self.aliases)

    def label(self) -> str:
        """``GHSA-… (CVE-…, high 8.8)``, the way a note names it."""
        names = ", ".join(self.aliases)
        rating = " ".join(p for p in (self.severity, self.cvss) if p)
        inner = "; ".join(p for p in (names, rating) if p)
        return f"{self.id} ({inner})" if inner else self.id


def load_advisories(directory: Path) -> list[Advisory]:
    """The advisories of ``directory/advisories.yaml``, in file order."""
    rows = _records(_read(directory, "advisories.yaml"), "advisories", "advisories.yaml")
    found = []
    for index, row in enumerate(rows):
        where = f"advisories.yaml advisories[{index}] {row.get('id')!r}"
        try:
            advisory = Advisory(id=str(row["id"]), aliases=_tuple(row.get("aliases")),
                                package=str(row["package"]), affected=str(row["affected"]),
                                fixed=str(row["fixed"]), severity=str(row.get("severity") or ""),
                                cvss=str(row.get("cvss") or ""), summary=str(row.get("summary") or ""),
                                note=str(row.get("note") or ""), **_sourced(row))
            SpecifierSet(advisory.affected)
            fixed = Version(advisory.fixed)
        except KeyError as exc:
            raise MatrixError(f"{where}: missing '{exc.args[0]}'", field="compat/advisories.yaml") from None
        except (InvalidSpecifier, InvalidVersion) as exc:
            raise MatrixError(f"{where}: {exc}", field="compat/advisories.yaml") from None
        if advisory.affects(advisory.package, advisory.fixed) or fixed.is_prerelease:
            raise MatrixError(f"{where}: fixed release {advisory.fixed} is inside its own range "
                              f"{advisory.affected}", field="compat/advisories.yaml")
        if advisory.severity not in SEVERITIES:
            raise MatrixError(f"{where}: severity {advisory.severity!r} is not one of "
                              f"{', '.join(SEVERITIES)}", field="compat/advisories.yaml")
        validate_record(advisory)
        found.append(advisory)
    return found
