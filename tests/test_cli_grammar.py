"""One argument grammar for every verb: key=value, --key value, --key=value and a YAML are
accepted by chat, api and webui as by train (the command line wins over the YAML)."""

from __future__ import annotations

import logging

import pytest

from tunesmith.cli.api import api_parser
from tunesmith.cli.arguments import parse_verb_args
from tunesmith.cli.chat_args import chat_parser
from tunesmith.cli.main import main
from tunesmith.errors import ConfigError


def test_api_takes_key_value_like_train(capsys):
    # refused before any model is loaded: the port is checked first
    assert main(["api", "model_name_or_path=/no/such/model", "port=70000"]) == 1
    err = capsys.readouterr().err
    assert "--port 70000 is not a TCP port" in err and "does not exist" not in err


@pytest.mark.parametrize("args", [
    ["model_name_or_path=m", "port=0", "trust_remote_code=true", "max_tokens=7"],
    ["--model_name_or_path", "m", "--port", "0", "--trust_remote_code", "--max_tokens=7"],
    ["port=0", "--model_name_or_path=m", "trust_remote_code=yes", "--max_tokens", "7"],
])
def test_api_forms_agree(args):
    ns = parse_verb_args(api_parser(), args)
    assert (ns.model_name_or_path, ns.port, ns.trust_remote_code, ns.max_tokens) == \
        ("m", 0, True, 7)


def test_yaml_sets_options_and_the_command_line_wins(tmp_path, caplog):
    path = tmp_path / "infer.yaml"
    path.write_text("model_name_or_path: from-yaml\ntemplate: chatml\nport: 9000\n"
                    "trust_remote_code: true\nlearning_rate: 0.001\n")
    with caplog.at_level(logging.WARNING):
        ns = parse_verb_args(api_parser(), [str(path), "port=9001"])
    assert (ns.config, ns.model_name_or_path, ns.template, ns.port, ns.trust_remote_code) == \
        (str(path), "from-yaml", "chatml", 9001, True)
    assert f"{path}:5: learning_rate" in caplog.text  # not used by api: said, with its line


def test_a_value_that_looks_like_key_value_stays_a_value():
    ns = parse_verb_args(chat_parser(), ["--prompt", "x=1", "stop=END", "--stop", "a=b"])
    assert ns.prompt == "x=1" and ns.stop == ["END", "a=b"]


def test_unknown_key_is_named_with_the_nearest_option():
    with pytest.raises(ConfigError, match=r"unknown option 'model_name' \(from command line\); "
                                          r"did you mean model_name_or_path"):
        parse_verb_args(chat_parser(), ["model_name=m"])
    with pytest.raises(ConfigError, match="flag; expected true or false"):
        parse_verb_args(chat_parser(), ["trust_remote_code=maybe"])


def test_chat_through_the_cli_with_key_value(tiny_llama_dir, capsys):
    assert main(["chat", f"model_name_or_path={tiny_llama_dir}", "prompt=hi",
                 "max_new_tokens=2", "temperature=0", "device=cpu"]) == 0
    assert "assistant> " in capsys.readouterr().out


def test_webui_takes_key_value(tmp_path, monkeypatch):
    import tunesmith.webui.app as app

    seen = {}
    monkeypatch.setattr(app, "build_app", lambda work_dir: seen.setdefault("dir", work_dir))
    monkeypatch.setattr(app, "launch", lambda built, options: seen.setdefault("port",
                                                                               options.port))
    assert main(["webui", f"work_dir={tmp_path}", "port=7999"]) == 0
    assert seen == {"dir": str(tmp_path), "port": 7999}
