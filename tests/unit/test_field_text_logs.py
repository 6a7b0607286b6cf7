"""Field text ``diagnose`` used to miss (issue 23): ``/var/log/dpkg.log`` excerpts, unattended-upgrades' log quoted
with indentation or ``>``, and that log in the program's translations."""

from __future__ import annotations

from pathlib import Path

import pytest

from remediation.core.parsers import apt_history, detect_kind
from remediation.core.parsers import unattended_upgrades as uu
from remediation.host.diagnose import diagnose, render_text

FIELD = Path(__file__).resolve().parents[1] / "fixtures" / "field"
# https://github.com/moby/moby/issues/30036 (tests/fixtures/field/SOURCES.md)
MOBY_DPKG = (FIELD / "dpkg-moby-30036.log").read_text()
KERNEL_RUN = (FIELD / "unattended-upgrades-kernel.log").read_text()

# dpkg(1), FILES, /var/log/dpkg.log: one line of each documented type (startup, an action, status, conffile), for a
# driver upgrade on a host with a newly installed kernel.
DPKG_DRIVER = """\
2024-05-02 06:25:09 startup archives unpack
2024-05-02 06:25:11 install linux-image-6.5.0-45-generic:amd64 <none> 6.5.0-45.45~22.04.1
2024-05-02 06:25:11 status half-installed linux-image-6.5.0-45-generic:amd64 6.5.0-45.45~22.04.1
2024-05-02 06:25:14 upgrade nvidia-dkms-535:amd64 535.161.08-0ubuntu2 535.183.01-0ubuntu1
2024-05-02 06:25:15 upgrade libnvidia-compute-535:amd64 535.183.01-0ubuntu1 535.183.01-0ubuntu1
2024-05-02 06:25:16 remove linux-image-6.5.0-41-generic:amd64 6.5.0-41.41~22.04.2 <none>
2024-05-02 06:25:20 startup packages configure
2024-05-02 06:25:20 configure linux-image-6.5.0-45-generic:amd64 6.5.0-45.45~22.04.1 <none>
2024-05-02 06:25:21 conffile /etc/modprobe.d/nvidia-graphics-drivers.conf keep
2024-05-02 06:25:58 status installed linux-image-6.5.0-45-generic:amd64 6.5.0-45.45~22.04.1
2024-05-02 06:26:40 status installed nvidia-dkms-535:amd64 535.183.01-0ubuntu1
"""


# --- dpkg.log --------------------------------------------------------------------------------------------------


def test_a_real_dpkg_log_excerpt_is_apt_history_with_its_kernel_installs() -> None:
    assert detect_kind(MOBY_DPKG) == "apt-history"
    result = diagnose(MOBY_DPKG)
    (tx,) = result.facts["transactions"]
    assert tx["source"] == "dpkg.log" and tx["actor"] == "unknown" and tx["commandline"] is None
    assert tx["start"] == "2017-01-10 15:40:57" and tx["end"] == "2017-01-10 15:41:06"
    assert [(a["action"], a["package"], a["old_version"], a["version"]) for a in tx["actions"]] == [
        ("Install", "linux-image-4.4.0-59-generic", None, "4.4.0-59.80"),
        ("Install", "linux-image-extra-4.4.0-59-generic", None, "4.4.0-59.80"),
        ("Upgrade", "linux-generic", "4.4.0.57.60", "4.4.0.59.62"),
        ("Upgrade", "linux-image-generic", "4.4.0.57.60", "4.4.0.59.62"),
    ]
    assert tx["states"]["linux-image-4.4.0-59-generic"] == "unpacked"
    installs = result.facts["kernel_installs"]
    assert installs[0]["kernel_release"] == "4.4.0-59-generic" and installs[0]["source"] == "dpkg.log"
    # no actor: the rules about what unattended-upgrade installed do not claim it
    assert result.findings == ()


def test_dpkg_log_line_types_as_dpkg_documents_them() -> None:
    history = apt_history.parse(DPKG_DRIVER)
    unpack, configure = history.transactions
    assert unpack.start == "2024-05-02 06:25:09" and unpack.source == "dpkg.log" and unpack.actor == "unknown"
    assert [(a.action, a.package, a.arch, a.old_version, a.version) for a in unpack.actions] == [
        ("Install", "linux-image-6.5.0-45-generic", "amd64", None, "6.5.0-45.45~22.04.1"),
        ("Upgrade", "nvidia-dkms-535", "amd64", "535.161.08-0ubuntu2", "535.183.01-0ubuntu1"),
        ("Reinstall", "libnvidia-compute-535", "amd64", None, "535.183.01-0ubuntu1"),
        ("Remove", "linux-image-6.5.0-41-generic", "amd64", None, "6.5.0-41.41~22.04.2"),
    ]
    assert configure.actions == ()  # configure / conffile / status change no version
    assert dict(configure.states) == {"linux-image-6.5.0-45-generic": "installed", "nvidia-dkms-535": "installed"}
    facts = diagnose(DPKG_DRIVER).facts
    assert [c["package"] for c in facts["nvidia_changes"]] == ["nvidia-dkms-535", "libnvidia-compute-535"]
    assert [k["kernel_release"] for k in facts["kernel_installs"]] == ["6.5.0-45-generic"]


def test_dpkg_log_pasted_after_history_log_keeps_both() -> None:
    stanza = (
        "Start-Date: 2024-05-02  06:25:08\nCommandline: /usr/bin/unattended-upgrade\n"
        "Upgrade: nvidia-dkms-535:amd64 (535.161.08-0ubuntu2, 535.183.01-0ubuntu1)\nEnd-Date: 2024-05-02  06:26:41\n"
    )
    history = apt_history.parse(stanza + DPKG_DRIVER)
    assert [t.source for t in history.transactions] == ["history.log", "dpkg.log", "dpkg.log"]
    assert history.transactions[0].actor == "unattended-upgrade"
    assert "GPU-KRN-004" in {f.id for f in diagnose(stanza + DPKG_DRIVER).findings}


def test_status_lines_alone_are_not_a_transaction() -> None:
    assert apt_history.parse("2024-05-02 06:25:21 conffile /etc/x keep\n").transactions == ()


# --- unattended-upgrades, quoted ---------------------------------------------------------------------------------


def _indented(text: str, prefix: str) -> str:
    return "".join(prefix + line if line.strip() else line for line in text.splitlines(keepends=True))


@pytest.mark.parametrize("prefix", ["    ", "\t", "> ", "  > "])
def test_a_quoted_lab_log_gives_the_same_facts_and_findings(prefix: str) -> None:
    plain = diagnose(KERNEL_RUN)
    quoted = diagnose(_indented(KERNEL_RUN, prefix))
    assert quoted.kind == "unattended-upgrades-log"
    assert quoted.facts == plain.facts
    assert [f.id for f in quoted.findings] == [f.id for f in plain.findings] == ["GPU-KRN-003", "GPU-KRN-006"]


def test_a_quoted_mail_report_keeps_its_names_below_the_header() -> None:
    report = "Packages that were upgraded:\n linux-image-generic nvidia-dkms-535\n\nUnattended-upgrades log:\n"
    log = uu.parse(_indented(report, "    "))
    assert log.packages == ("linux-image-generic", "nvidia-dkms-535")


# --- unattended-upgrades, translated -----------------------------------------------------------------------------
# Each message as the program's po files translate it (gettext: a run with LANG set logs these):
#   de, es, pt_BR: mvo5/unattended-upgrades po/de.po, po/es.po, po/pt_BR.po at 0efdbcf7453f7c315bc596855df322814790889e
#     (unattended-upgrades 0.8x, POT-Creation-Date 2015-07-02);
#   fr: mvo5/unattended-upgrades po/fr.po at 9b1e871092e8c7c4544110a674bdcbcf9c2b14dd (POT 2009-07-03, msgid
#     "Packages that are upgraded: %s"); fr_2008: the same file at 19372a7c7ea99adf75054de47b935ce85c358161.
# Fuzzy entries (pt_BR "Packages that will be upgraded", de "No packages found ...") are not compiled, so those
# messages stay English. "Package X is blacklisted" / "kept back" are not in these po files: no translation to test.
TRANSLATED = {
    "de": (
        "Skript für unbeaufsichtigte Upgrades wird gestartet.",
        "erlaubte Ursprünge sind: o=Ubuntu,a=jammy-security, o=UbuntuESMApps,a=jammy-apps-security",
        "Pakete, die anfangs auf die schwarzen Liste standen: nvidia- linux-image",
        "Pakete, von denen ein Upgrade durchgeführt wird: linux-image-6.5.0-45-generic nvidia-dkms-535",
        "alle Upgrades installiert",
    ),
    "fr": (
        "Démarrage du script de mise à niveau automatique",
        "Les origines permises sont : o=Ubuntu,a=jammy-security, o=UbuntuESMApps,a=jammy-apps-security",
        "Paquets initialement sur la liste noire : nvidia- linux-image",
        "Paquets mis à niveau : linux-image-6.5.0-45-generic nvidia-dkms-535",
        "Toutes les mises à niveau ont été installées",
    ),
    "fr_2008": (
        "Démarrage du script de mise à jour automatique",
        "Les origines permises sont : o=Ubuntu,a=jammy-security, o=UbuntuESMApps,a=jammy-apps-security",
        "Paquets initialement sur la liste noire : nvidia- linux-image",
        "Paquets mis à jour : linux-image-6.5.0-45-generic nvidia-dkms-535",
        "Toutes les mises à jour ont été installées",
    ),
    "es": (
        "Iniciando guión de actualizaciones desatendidas",
        "Fuentes permitidas: o=Ubuntu,a=jammy-security, o=UbuntuESMApps,a=jammy-apps-security",
        "Paquetes bloqueados inicialmente: nvidia- linux-image",
        "Paquetes que se actualizarán: linux-image-6.5.0-45-generic nvidia-dkms-535",
        "Se han instalado todas las actualizaciones",
    ),
    "pt_BR": (
        "Iniciando o script da atualização desacompanhada",
        "São origens permitidas: o=Ubuntu,a=jammy-security, o=UbuntuESMApps,a=jammy-apps-security",
        "Pacotes inicialmente na lista negra: nvidia- linux-image",
        "Pacotes atualizados: linux-image-6.5.0-45-generic nvidia-dkms-535",
        "Todas as atualizações instaladas",
    ),
}


def _log(messages: tuple[str, ...]) -> str:
    times = ("06:25:01,123", "06:25:01,124", "06:25:01,125", "06:25:05,200", "06:27:10,300")
    return "".join(f"2024-05-02 {t} INFO {m}\n" for t, m in zip(times, messages, strict=True))


@pytest.mark.parametrize("lang", sorted(TRANSLATED))
def test_a_translated_log_is_read_like_the_english_one(lang: str) -> None:
    text = _log(TRANSLATED[lang])
    assert detect_kind(text) == "unattended-upgrades-log"
    result = diagnose(text)
    facts = result.facts
    assert facts["packages"] == ["linux-image-6.5.0-45-generic", "nvidia-dkms-535"]
    assert facts["blacklisted"] == ["nvidia-", "linux-image"]
    assert facts["allowed_origins"] == ["o=Ubuntu,a=jammy-security", "o=UbuntuESMApps,a=jammy-apps-security"]
    (run,) = facts["runs"]
    assert run["result"] == "installed" and run["start"] == "2024-05-02 06:25:01"
    english = diagnose(
        _log(
            (
                "Starting unattended upgrades script",
                "Allowed origins are: o=Ubuntu,a=jammy-security, o=UbuntuESMApps,a=jammy-apps-security",
                "Initial blacklist: nvidia- linux-image",
                "Packages that will be upgraded: linux-image-6.5.0-45-generic nvidia-dkms-535",
                "All upgrades installed",
            )
        )
    )
    assert [f.id for f in result.findings] == [f.id for f in english.findings]
    # the translated lines are the findings' evidence, as the English ones are
    assert all(len(f.evidence) >= 4 for f in result.findings if f.id == "GPU-KRN-006")
    assert TRANSLATED[lang][0] in render_text(result)


@pytest.mark.parametrize(
    ("line", "result"),
    [
        ("Installation der Upgrades fehlgeschlagen!", "failed"),  # de.po
        ("Échec de l'installation des mises à niveau", "failed"),  # fr.po
        ("Fallo al instalar actualizaciones", "failed"),  # es.po
        ("A instalação das atualizações falhou!", "failed"),  # pt_BR.po
        ("Aucun paquet à mettre à niveau automatiquement", "nothing to do"),  # fr.po
        ("No se encontraron paquetes que puedan actualizarse de forma desatendida y no hay pendiente ninguna "
         "desinstalación automática", "nothing to do"),  # es.po
    ],
)
def test_translated_outcomes(line: str, result: str) -> None:
    log = uu.parse(f"2024-05-02 06:25:01,123 INFO {TRANSLATED['de'][0]}\n2024-05-02 06:27:10,300 INFO {line}\n")
    assert log.runs[0].result == result


@pytest.mark.parametrize(
    "line",
    [
        "Das Paket »nvidia-dkms-535« hat eine Conffile-Abfrage und muss einem manuellen Upgrade unterzogen werden.",
        "Le paquet « nvidia-dkms-535 » provoque un conflit de fichiers de configuration et nécessite une mise à "
        "niveau manuelle",
        "El paquete «nvidia-dkms-535» solicita confirmación a través de un conffile, y se debe actualizar de forma "
        "manual",
        "O pacote 'nvidia-dkms-535' possui um diálogo conffile e necessita ser atualizado manualmente",
    ],
)
def test_translated_conffile_prompts(line: str) -> None:
    log = uu.parse(f"2024-05-02 06:25:01,123 INFO {TRANSLATED['es'][0]}\n2024-05-02 06:27:10,300 INFO {line}\n")
    assert log.runs[0].conffile_prompts == ("nvidia-dkms-535",)
