"""Reading a host's SSH command line the way Ansible builds it and ssh(1) reads it (pure, no host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from remediation.core.errors import InventoryError
from remediation.transport.sshopts import JumpHost, local_user, parse_jump, ssh_target

ANSIBLE_CFG_SSH_ARGS = "-C -o ControlMaster=auto -o ControlPersist=60s"


def target(common: str = "", extra: str = "", **kw):  # type: ignore[no-untyped-def]
    args = {"host": "10.0.0.5", "port": None, "user": None, "private_key_file": None, "ssh_args": ANSIBLE_CFG_SSH_ARGS}
    args.update(kw)
    return ssh_target(common_args=common, extra_args=extra, where="host gpu-1", **args)


def test_lab_style_inventory() -> None:
    t = target(
        "-o UserKnownHostsFile=/lab/known_hosts -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes",
        port=22, user="root", private_key_file="/lab/id_ed25519",
    )
    assert (t.host, t.port, t.user) == ("10.0.0.5", 22, "root")
    assert t.options.identity_files == (Path("/lab/id_ed25519"),)
    assert t.options.identities_only is True
    assert t.options.user_known_hosts == (Path("/lab/known_hosts"),)
    assert t.options.global_known_hosts is None  # ssh's default: /etc/ssh/ssh_known_hosts
    assert t.options.proxy_jump == () and t.options.proxy_command is None


def test_defaults_are_openssh_defaults() -> None:
    t = target()
    assert t.port == 22 and t.user == local_user()[0]
    assert t.options.identity_files == () and t.options.user_known_hosts is None and not t.options.identities_only


@pytest.mark.parametrize(
    "common",
    [
        "-J ops@bastion.example.com:2222",
        "-Jops@bastion.example.com:2222",
        "-o ProxyJump=ops@bastion.example.com:2222",
        "-o 'ProxyJump ops@bastion.example.com:2222'",
        "-oProxyJump=ssh://ops@bastion.example.com:2222",
    ],
)
def test_proxyjump_every_spelling(common: str) -> None:
    assert target(common).options.proxy_jump == (JumpHost("bastion.example.com", 2222, "ops"),)


def test_proxyjump_in_extra_args_and_chains() -> None:
    t = target(extra="-J first,root@second:2200")
    assert t.options.proxy_jump == (JumpHost("first", 22, None), JumpHost("second", 2200, "root"))
    assert parse_jump("[fd00::1]:2022", "x") == (JumpHost("fd00::1", 2022, None),)


def test_proxycommand_tokens_expanded() -> None:
    t = target("-o ProxyCommand='ssh -W %h:%p -l %r bastion'", port=2201, user="ops")
    assert t.options.proxy_command == "ssh -W 10.0.0.5:2201 -l ops bastion"
    assert t.options.proxy_jump == ()


def test_first_of_proxyjump_and_proxycommand_wins_and_none_turns_off() -> None:
    t = target("-o ProxyCommand='nc %h %p'", extra="-J bastion")
    assert t.options.proxy_command == "nc 10.0.0.5 22" and t.options.proxy_jump == ()
    t = target("-o ProxyJump=none", extra="-J bastion")
    assert t.options.proxy_jump == () and t.options.proxy_command is None


def test_ansible_own_options_win_over_args_first_value_wins() -> None:
    t = target("-o Port=2200 -p 2300 -l other -o User=other2", port=2222, user="root")
    assert (t.port, t.user) == (2222, "root")
    t = target("-p 2300 -o Port=2200 -l other")
    assert (t.port, t.user) == (2300, "other")


def test_identity_files_accumulate_in_order() -> None:
    t = target("-i /k/one -o IdentityFile=/k/two", private_key_file="/k/zero")
    assert t.options.identity_files == (Path("/k/zero"), Path("/k/one"), Path("/k/two"))


def test_known_hosts_lists_tilde_tokens_and_none() -> None:
    home = local_user()[1]
    t = target("-o 'UserKnownHostsFile=~/.ssh/a \"/x y/b\"' -o GlobalKnownHostsFile=/etc/ssh/fleet_%h")
    assert t.options.user_known_hosts == (home / ".ssh/a", Path("/x y/b"))
    assert t.options.global_known_hosts == (Path("/etc/ssh/fleet_10.0.0.5"),)
    assert target("-o UserKnownHostsFile=none").options.user_known_hosts == ()


def test_hostname_option_and_a_destination_with_a_percent_sign() -> None:
    assert target("-o HostName=%h.fleet.example").host == "10.0.0.5.fleet.example"
    assert target(host="fe80::1%eth0").host == "fe80::1%eth0"  # the destination itself is not token-expanded


def test_identity_agent_and_host_key_alias() -> None:
    assert target("-o IdentityAgent=none").options.identity_agent == "none"
    assert target("-o IdentityAgent=SSH_AUTH_SOCK").options.identity_agent is None
    assert target("-o IdentityAgent=/run/agent.sock").options.identity_agent == "/run/agent.sock"
    assert target("-o HostKeyAlias=gpu-1.fleet").options.host_key_alias == "gpu-1.fleet"


def test_options_that_do_not_change_the_route_are_accepted() -> None:
    t = target("-4 -C -q -o ServerAliveInterval=30 -o StrictHostKeyChecking=no -o LogLevel=ERROR -T")
    assert t.options.proxy_jump == ()


@pytest.mark.parametrize(
    ("common", "message"),
    [
        ("-F /etc/fleet/ssh_config", "-F /etc/fleet/ssh_config"),
        ("-Z", "option -Z not recognized"),
        ("-o ProxyJump=host:99999", "not 1-65535"),
        ("-o NoValue", "is not Key=Value"),
        ("-o IdentitiesOnly=maybe", "must be yes or no"),
        ("somehost", "unexpected argument"),
        ("-o 'UserKnownHostsFile=/a/%z'", "unknown token %z"),
        ("-o 'unclosed", "cannot split"),
    ],
)
def test_bad_args_fail_naming_the_host(common: str, message: str) -> None:
    with pytest.raises(InventoryError) as err:
        target(common)
    assert "host gpu-1" in str(err.value) and message in str(err.value)


# Issue 20, item 1: names that reach a ProxyCommand (CVE-2023-51385).


@pytest.mark.parametrize(
    ("kw", "common", "variable"),
    [
        ({"host": "127.0.0.1$(touch pwned)"}, "", "ansible_host"),
        ({"host": "-oProxyCommand=id"}, "", "ansible_host"),
        ({"host": "gpu-1\nid"}, "", "ansible_host"),
        ({"user": "root;id"}, "", "ansible_user"),
        ({"user": "root\nid"}, "", "ansible_user"),
        ({"user": "a -oProxyCommand=id"}, "", "ansible_user"),
        ({}, "-l 'ops|id'", "-l / -o User"),
        ({}, "-o HostName=`id`", "-o HostName"),
        ({}, "-o HostName=%n$(id)", "-o HostName"),
        ({}, "-J 'ops@bast;id'", "ProxyJump host"),
        ({}, "-J 'o(ps@bastion'", "ProxyJump user"),
    ],
)
def test_shell_metacharacters_in_names_are_refused(kw: dict[str, str], common: str, variable: str) -> None:
    with pytest.raises(InventoryError) as err:
        target(common + " -o ProxyCommand='true %h %r'", **kw)
    message = str(err.value)
    assert "\n" not in message and message.startswith("host gpu-1: ") and variable in message
    assert "CVE-2023-51385" in message


def test_host_var_names_the_variable() -> None:
    with pytest.raises(InventoryError, match="inventory_hostname 'gpu;1'"):
        target(host="gpu;1", host_var="inventory_hostname")


@pytest.mark.parametrize(
    ("kw", "common", "expected"),
    [
        # %h, %n: a name OpenSSH accepts but the shell would glob or expand (* ? [ ~ # ! %) is quoted.
        ({"host": "gpu*"}, "-o ProxyCommand='nc %h %p'", "nc 'gpu*' 22"),
        ({"host": "gpu-[1]"}, "-o ProxyCommand='nc %n %p'", "nc 'gpu-[1]' 22"),
        ({"host": "~gpu#1"}, "-o ProxyCommand='nc %h %p'", "nc '~gpu#1' 22"),
        # %r: OpenSSH accepts $ and \ and spaces in user names (DOMAIN\user, machine$): quoted.
        ({"user": "DOM\\ops$x"}, "-o ProxyCommand='ssh -l %r -W %h:%p b'", "ssh -l 'DOM\\ops$x' -W 10.0.0.5:22 b"),
        ({"user": "a b"}, "-o ProxyCommand='ssh -l %r b'", "ssh -l 'a b' b"),
        # %k: HostKeyAlias is free text from the inventory.
        ({}, "-o HostKeyAlias='x y' -o ProxyCommand='echo %k'", "echo 'x y'"),
        # %p is digits; %% stays a percent sign; a plain name is unchanged (nothing to quote).
        ({"port": 2222}, "-o ProxyCommand='nc %h %p %%'", "nc 10.0.0.5 2222 %"),
        ({}, "-o HostName=%n.example -o ProxyCommand='nc %h %p'", "nc 10.0.0.5.example 22"),
    ],
)
def test_every_proxycommand_token_is_quoted(kw: dict[str, object], common: str, expected: str) -> None:
    assert target(common, **kw).options.proxy_command == expected


def test_quoted_tokens_are_one_shell_word_each() -> None:
    import shlex

    t = target("-o ProxyCommand='cmd %h %r %k %u %d %l'", host="a*b", user="u$x y")
    words = shlex.split(t.options.proxy_command or "")
    _, home = local_user()
    assert words[:4] == ["cmd", "a*b", "u$x y", "a*b"] and words[5] == str(home)
