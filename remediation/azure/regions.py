"""Azure region names, to refuse an unknown ``--location`` before anything is sent.

The programmatic names (``az account list-locations --query '[].name'``) of Azure's public regions, Azure Government
and Azure operated by 21Vianet (China). A region newer than this list goes in ``azure.extra_locations``.
"""

from __future__ import annotations

from collections.abc import Iterable

from remediation.azure.errors import AzureInputError

__all__ = ["KNOWN_LOCATIONS", "normalize_location"]

KNOWN_LOCATIONS: frozenset[str] = frozenset(
    (
        "australiacentral", "australiacentral2", "australiaeast", "australiasoutheast", "austriaeast",
        "belgiumcentral", "brazilsouth", "brazilsoutheast", "canadacentral", "canadaeast", "centralindia",
        "centralus", "centraluseuap", "chilecentral", "eastasia", "eastus", "eastus2", "eastus2euap",
        "francecentral", "francesouth", "germanycentral", "germanynorth", "germanynortheast",
        "germanywestcentral", "indonesiacentral", "israelcentral", "italynorth", "japaneast", "japanwest",
        "jioindiacentral", "jioindiawest", "koreacentral", "koreasouth", "malaysiawest", "mexicocentral",
        "newzealandnorth", "northcentralus", "northeurope", "norwayeast", "norwaywest", "polandcentral",
        "qatarcentral", "southafricanorth", "southafricawest", "southcentralus", "southeastasia", "southindia",
        "spaincentral", "swedencentral", "swedensouth", "switzerlandnorth", "switzerlandwest", "uaecentral",
        "uaenorth", "uksouth", "ukwest", "westcentralus", "westeurope", "westindia", "westus", "westus2",
        "westus3", "usdodcentral", "usdodeast", "usgovarizona", "usgovtexas", "usgovvirginia", "usseceast",
        "ussecwest", "usseccentral", "usnateast", "usnatwest", "chinaeast", "chinaeast2", "chinaeast3",
        "chinanorth", "chinanorth2", "chinanorth3",
    )
)


def normalize_location(location: str | None, extra: Iterable[str] = ()) -> str:
    """``location`` as ARM names it (``East US`` -> ``eastus``); :class:`AzureInputError` for an unknown one."""
    if location is None or not str(location).strip():
        raise AzureInputError("--location is required: an Azure region such as eastus (az account list-locations)")
    name = "".join(str(location).split()).lower()
    known = KNOWN_LOCATIONS | {e.strip().lower() for e in extra}
    if name not in known:
        close = sorted(k for k in known if k[:4] == name[:4])[:5]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise AzureInputError(
            f"unknown Azure location {location!r}{hint}: use a region name from `az account list-locations -o table`,"
            " or add a new region to azure.extra_locations in invoke.yaml"
        )
    return name
