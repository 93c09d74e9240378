from pathlib import Path

import pytest

from rooftop.errors import RooftopError
from rooftop.spec import DeploymentSpec, apply_changes, args_to_argv, load_deployment

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def write(tmp_path, text, name="spec.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(path, lever=None) -> str:
    with pytest.raises(RooftopError) as info:
        load_deployment(path, lever)
    return str(info.value)


def test_examples_load():
    pd = load_deployment(EXAMPLES / "pd-embedded.toml")
    assert pd.engine == "embedded" and pd.topology == "pd" and pd.model == "tiny"
    assert list(pd.roles()) == ["prefill", "decode", "router"]
    assert pd.prefill.cpus == [0] and pd.decode.cpus == [1] and pd.router.cpus is None

    sg = load_deployment(EXAMPLES / "sglang-pd.toml")
    assert (sg.prefill.gpus, sg.prefill.numa, sg.decode.gpus, sg.decode.numa) == ([0, 1, 2, 3], 0, [4, 5, 6, 7], 1)
    assert sg.role_args("prefill")["disaggregation-bootstrap-port"] == 8998
    assert "disaggregation-bootstrap-port" not in sg.role_args("decode")

    vl = load_deployment(EXAMPLES / "vllm-pd.toml")
    assert vl.role_env("decode")["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"  # TOML int -> env string

    single = load_deployment(EXAMPLES / "sglang-single.toml")
    assert list(single.roles()) == ["single"] and single.single.gpus == [0, 1, 2, 3]
    assert load_deployment(EXAMPLES / "embedded-single.toml").single.cpus == [0]


def test_cpu_list_string_and_list():
    spec = DeploymentSpec.model_validate({"engine": "embedded", "single": {"cpus": "0-3,8"}})
    assert spec.single.cpus == [0, 1, 2, 3, 8]
    spec = DeploymentSpec.model_validate({"engine": "embedded", "single": {"cpus": [3, 1, 3]}})
    assert spec.single.cpus == [1, 3]


def test_single_role_defaults_when_absent():
    spec = DeploymentSpec.model_validate({"engine": "vllm", "model": "/m"})
    assert spec.single is not None and spec.single.host == "127.0.0.1" and spec.single.port is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('engine = "embedded"\n[deployment.single]\nnuma = 0\ncpus = "0"\n',
         "deployment.single: give either `numa` or `cpus`, not both"),
        ('engine = "embedded"\n[deployment.prefill]\nnuma = "zero"\n',
         "deployment.prefill.numa: Input should be a valid integer"),
        ('engine = "embedded"\n[deployment.single]\nnuam = 0\n', "deployment.single.nuam: unknown key"),
        ('engine = "tgi"\n', "deployment.engine: Input should be 'embedded', 'sglang' or 'vllm'"),
        ('engine = "embedded"\ntopology = "pd"\n[deployment.prefill]\ncpus = "0"\n',
         "topology \"pd\" needs a [decode] table"),
        ('engine = "embedded"\n[deployment.prefill]\ncpus = "0"\n', "topology \"single\" has no prefill role"),
        ('engine = "embedded"\nargs = { "--context-length" = 8 }\n',
         "deployment.args: engine flag '--context-length' must be written without leading dashes"),
        ('engine = "embedded"\n[deployment.single]\ncpus = "3-1"\n', "deployment.single.cpus: not a CPU list"),
        ('engine = "embedded"\n[deployment.single]\nport = 70000\n', "deployment.single.port: Input should be less"),
        ('engine = "embedded"\ntopology = "pd"\n[deployment.prefill]\nport = 9\n[deployment.decode]\nport = 9\n',
         "roles prefill and decode both listen on 127.0.0.1:9"),
    ],
)
def test_errors_name_file_key_and_reason(tmp_path, body, expected):
    path = write(tmp_path, "[deployment]\n" + body)
    message = error_of(path)
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_file_level_errors(tmp_path):
    assert "no such file" in error_of(tmp_path / "missing.toml")
    assert "not valid TOML" in error_of(write(tmp_path, "[deployment\nengine = 1\n")) and "line 1" in error_of(
        write(tmp_path, "[deployment\nengine = 1\n")
    )
    assert "no [deployment] table" in error_of(write(tmp_path, "[campaign]\nname = 'x'\n"))


CAMPAIGN = """
[campaign]
name = "c"
[model]
path = "/models/m"
[deployment]
engine = "sglang"
args = { tp-size = 4, context-length = 1048576 }
[deployment.single]
gpus = [0, 1, 2, 3]
numa = 0
[[lever]]
name = "pd"
hypothesis = "isolating decode from prefill raises tok/s at C>=8"
topology = "pd"
prefill = { gpus = [0, 1, 2, 3], numa = 0 }
decode = { gpus = [4, 5, 6, 7], numa = 1 }
[[lever]]
name = "context-8k"
hypothesis = "indexer work scales with the allocated context"
args = { context-length = 8192 }
quality_check = true
[[lever]]
name = "bad"
topology = "pd"
prefill = { gpus = [0] }
"""


def test_campaign_file_model_and_levers(tmp_path):
    path = write(tmp_path, CAMPAIGN)
    base = load_deployment(path)
    assert base.model == "/models/m" and base.topology == "single" and base.single.numa == 0

    ctx = load_deployment(path, "context-8k")
    assert ctx.args == {"tp-size": 4, "context-length": 8192}
    assert ctx.single.gpus == [0, 1, 2, 3]

    pd = load_deployment(path, "pd")
    assert pd.topology == "pd" and pd.single is None
    assert (pd.prefill.numa, pd.decode.gpus) == (0, [4, 5, 6, 7])
    assert pd.router is not None and pd.args["context-length"] == 1048576

    assert "no lever named 'nope' (levers: pd, context-8k, bad)" in error_of(path, "nope")
    assert "lever 'bad': deployment: topology \"pd\" needs a [decode] table" in error_of(path, "bad")


def test_apply_lever_merges_role_tables():
    spec = DeploymentSpec.model_validate(
        {
            "engine": "embedded",
            "topology": "pd",
            "env": {"A": "1"},
            "prefill": {"cpus": [0], "args": {"page-size": 64}, "env": {"P": "x"}},
            "decode": {"numa": 0},
        }
    )
    out = apply_changes(
        spec,
        {
            "name": "move",
            "hypothesis": "ignored: it is the lever's own",
            "env": {"B": "2"},
            "prefill": {"numa": 0, "args": {"chunked-prefill-size": 256}, "env": {"Q": "y"}},
            "decode": {"cpus": "1"},
        },
    )
    assert out.env == {"A": "1", "B": "2"}
    assert (out.prefill.numa, out.prefill.cpus) == (0, None)  # numa replaced the CPU list
    assert out.prefill.args == {"page-size": 64, "chunked-prefill-size": 256}
    assert out.prefill.env == {"P": "x", "Q": "y"}
    assert (out.decode.numa, out.decode.cpus) == (None, [1])
    assert spec.prefill.cpus == [0]  # the baseline is untouched

    back = apply_changes(out, {"topology": "single", "single": {"cpus": "0-1"}})
    assert list(back.roles()) == ["single"] and back.single.cpus == [0, 1] and back.prefill is None


def test_args_to_argv():
    assert args_to_argv({"tp-size": 4, "enable-metrics": True, "disable-x": False, "ratio": 0.5, "mode": "a b"}) == [
        "--tp-size", "4", "--enable-metrics", "--ratio", "0.5", "--mode", "a b",
    ]  # fmt: skip


def test_roles_on_hosts_and_their_mistakes(tmp_path):
    good = write(tmp_path, '[deployment]\nengine = "sglang"\nmodel = "/m"\n'
                 '[deployment.hosts.gpu-a]\naddress = "10.0.0.1"\n[deployment.hosts.gpu-b]\n'
                 '[deployment.single]\nnodes = ["gpu-a", "gpu-b"]\n')
    spec = load_deployment(good)
    assert spec.rank0_host("single") == "gpu-a" and spec.machine("single") == "gpu-a"  # rank 0's host
    assert spec.single.host == "127.0.0.1"  # as written: validation changes nothing (a lever may move the nodes)
    assert (spec.address("gpu-a"), spec.address("gpu-b")) == ("10.0.0.1", "gpu-b")  # the name when none given
    placed = spec.placed()
    assert placed.single.host == "10.0.0.1" and placed.machine("single") == "gpu-a" and spec.single.host == "127.0.0.1"
    assert load_deployment(EXAMPLES / "pd-embedded.toml").placed().machine("prefill") is None  # local stays local

    unknown = error_of(write(tmp_path, '[deployment]\nengine = "sglang"\nmodel = "/m"\n'
                             '[deployment.hosts.gpu-a]\n[deployment.single]\nnodes = ["gpu-a", "gpu-c"]\n'))
    assert "deployment: single.nodes names 'gpu-c', which no [deployment.hosts.NAME] table defines (hosts: gpu-a)" \
        in unknown and "add the table or fix the name" in unknown and "spec.toml" in unknown
    typo = error_of(write(tmp_path, '[deployment]\nengine = "vllm"\n[deployment.hosts.a]\nadress = "x"\n'))
    assert "deployment.hosts.a.adress: unknown key" in typo
    option = error_of(write(tmp_path, '[deployment]\nengine = "vllm"\n[deployment.hosts.a]\nssh_options = ["-v"]\n'))
    assert "deployment.hosts.a.ssh_options: ssh option '-v' is not KEY=VALUE" in option
    port0 = error_of(write(tmp_path, '[deployment]\nengine = "embedded"\n[deployment.hosts.a]\n'
                           '[deployment.single]\nhost = "a"\nport = 0\n'))
    assert "single runs on host 'a': give it a port" in port0

    split = error_of(write(tmp_path, '[deployment]\nengine = "embedded"\ntopology = "pd"\n[deployment.hosts.a]\n'
                           '[deployment.prefill]\nhost = "a"\n[deployment.decode]\n'))
    assert "decode listens on '127.0.0.1' on this machine's loopback, and prefill runs on host 'a', which cannot reach it" in split


def test_pd_worker_other_host_cannot_reach_is_refused(tmp_path):
    """A local worker bound to loopback, a wildcard (the router hands the other worker its loopback URL) or a
    localhost name cannot be reached by a worker on another host: refused, whichever the spelling."""
    for host in ("127.0.0.1", "127.1", "::1", "localhost", "localhost6", "0.0.0.0", "::"):
        err = error_of(write(tmp_path, '[deployment]\nengine = "embedded"\ntopology = "pd"\n'
                             '[deployment.hosts.a]\naddress = "10.0.0.1"\n[deployment.prefill]\nhost = "a"\nport = 30001\n'
                             f'[deployment.decode]\nhost = "{host}"\nport = 30002\n'))
        assert f"decode listens on {host!r}" in err and "prefill runs on host 'a', which cannot reach it" in err, err
        assert "set decode.host to this machine's address that host 'a' reaches" in err
    wildcard = error_of(write(tmp_path, '[deployment]\nengine = "embedded"\ntopology = "pd"\n[deployment.hosts.a]\n'
                              '[deployment.prefill]\nhost = "a"\nport = 1\n[deployment.decode]\nhost = "0.0.0.0"\n'))
    assert "rooftop hands the other worker its loopback URL" in wildcard
    # an address of this machine that other hosts reach is the user's word: accepted
    ok = load_deployment(write(tmp_path, '[deployment]\nengine = "embedded"\ntopology = "pd"\n[deployment.hosts.a]\n'
                               '[deployment.prefill]\nhost = "a"\nport = 1\n[deployment.decode]\nhost = "10.0.0.9"\n'))
    assert ok.machine("prefill") == "a" and ok.machine("decode") is None


def test_router_on_a_host_is_refused(tmp_path):
    """The pd router runs on this machine (its interpreter, rooftop): placing it on a hosts entry is an error."""
    err = error_of(write(tmp_path, '[deployment]\nengine = "vllm"\nmodel = "/m"\ntopology = "pd"\n'
                         '[deployment.hosts.a]\naddress = "10.0.0.1"\n[deployment.prefill]\nport = 8100\n'
                         '[deployment.decode]\nport = 8200\n[deployment.router]\nhost = "a"\nport = 8000\n'))
    assert "router.host is 'a', a [deployment.hosts] entry, but the pd router runs on this machine" in err
    assert "leave router.host out" in err


def test_misspelt_host_is_refused_with_the_closest_entry(tmp_path):
    """With hosts defined, a role's host that is neither an entry nor an address of this machine is a typo."""
    head = ('[deployment]\nengine = "sglang"\nmodel = "/m"\n[deployment.hosts.gpu-a]\naddress = "10.0.0.1"\n'
            '[deployment.hosts.gpu-b]\n')
    err = error_of(write(tmp_path, head + '[deployment.single]\nhost = "gpu-A"\nport = 30000\n'))
    assert "single.host is 'gpu-A', which is neither a [deployment.hosts] entry (hosts: gpu-a, gpu-b)" in err
    assert "did you mean 'gpu-a'?" in err
    far = error_of(write(tmp_path, head + '[deployment.single]\nhost = "zzz"\n'))
    assert "single.host is 'zzz'" in far and "did you mean" not in far
    for local in ("10.0.0.5", "127.0.0.1", "::1", "0.0.0.0", "localhost"):  # addresses of this machine
        spec = load_deployment(write(tmp_path, head + f'[deployment.single]\nhost = "{local}"\n'))
        assert spec.machine("single") is None and spec.single.host == local
    # without a hosts table a name is a bind address as before
    assert load_deployment(write(tmp_path, '[deployment]\nengine = "sglang"\nmodel = "/m"\n'
                                 '[deployment.single]\nhost = "myname"\n')).single.host == "myname"


def test_host_names_must_be_file_names(tmp_path):
    """A hosts entry's name becomes launch-NAME.sh and ssh-NAME.log: '/' and the like are refused up front."""
    err = error_of(write(tmp_path, '[deployment]\nengine = "sglang"\nmodel = "/m"\n[deployment.hosts."rack1/gpu-a"]\n'
                         'address = "10.0.0.1"\n[deployment.single]\nhost = "rack1/gpu-a"\nport = 30000\n'))
    assert "hosts.'rack1/gpu-a': a host's name is letters, digits" in err and "rename the table" in err


def test_lever_moves_a_multi_node_role():
    """A lever changing a multi-node role's nodes places rank 0 on the new first node (the baseline's rank-0 host
    is not carried over); one giving `host` takes the role off its nodes."""
    base = DeploymentSpec.model_validate({
        "engine": "sglang", "model": "/m",
        "hosts": {"a": {"address": "10.0.0.1"}, "b": {"address": "10.0.0.2"}, "c": {"address": "10.0.0.3"}},
        "single": {"nodes": ["a", "b"], "gpus": [0, 1], "port": 30000}})
    moved = apply_changes(base, {"single": {"nodes": ["c", "b"]}}, "move")
    assert moved.machine("single") == "c" and moved.single.nodes == ["c", "b"]
    assert moved.placed().single.host == "10.0.0.3"
    one = apply_changes(base, {"single": {"nodes": ["c"]}}, "one")
    assert one.machine("single") == "c" and one.single.nodes == ["c"]
    to_host = apply_changes(base, {"single": {"host": "b"}}, "to-host")
    assert to_host.machine("single") == "b" and to_host.single.nodes == []
    # a baseline written with host = its first node moves as well
    written = DeploymentSpec.model_validate({**base.model_dump(exclude_none=True),
                                             "single": {"host": "a", "nodes": ["a", "b"], "port": 30000}})
    assert apply_changes(written, {"single": {"nodes": ["c", "b"]}}, "m").machine("single") == "c"
    assert base.machine("single") == "a"  # the baseline is unchanged


def test_campaign_with_a_lever_moving_nodes_loads():
    from rooftop.spec.campaign import CampaignSpec

    spec = CampaignSpec.model_validate({
        "campaign": {"name": "x", "goal": "g"}, "model": {"path": "/m"},
        "deployment": {"engine": "sglang", "hosts": {"a": {}, "b": {}, "c": {}},
                       "single": {"nodes": ["a", "b"], "gpus": [0, 1]}},
        "bench": {"concurrency": [1]},
        "lever": [{"name": "swap-node", "hypothesis": "h", "single": {"nodes": ["c", "b"]}}]})
    assert [lever.name for lever in spec.levers] == ["swap-node"]
