"""The side-effect policy: built-in rules, policy files, and malformed files."""

from __future__ import annotations

import pytest
from worldline.client.errors import InvalidArgument
from worldline.wire.policy import Policy, split_commands

NON = "external_non_idempotent"


@pytest.mark.parametrize("command, effect", [
    ("git push origin main", NON),
    ("cd repo && git push --force", NON),
    ("npm publish", NON),
    ("python3 -m twine upload dist/*", NON),
    ("npx vercel deploy --prod", NON),
    ("twine upload dist/*", NON),
    ("docker push registry/app:1", NON),
    ("kubectl apply -f deploy.yaml", NON),
    ("kubectl get pods", "read_only"),
    ("terraform apply -auto-approve", NON),
    ("terraform destroy", NON),
    ("helm upgrade app ./chart", NON),
    ("curl -X POST https://api.example.com/charge", NON),
    ("curl --data 'a=1' https://x", NON),
    ("curl https://example.com", "read_only"),
    ("wget --post-data=x https://x", NON),
    ("ssh prod-host 'systemctl restart app'", NON),
    ("scp build.tar user@host:/srv/", NON),
    ("rsync -a dist/ deploy@web:/var/www/", NON),
    ("rsync -a dist/ backup/", "local"),
    ("gh pr create --fill", NON),
    ("gh release create v1", NON),
    ("aws s3 cp x s3://bucket/x", NON),
    ("aws ec2 terminate-instances --instance-ids i-1", NON),
    ("gcloud run deploy svc", NON),
    ("az group create -n x", NON),
    ("sendmail bob@example.com < msg", NON),
    ("sudo FOO=1 git push", NON),
    ("ls -la && cat README.md", "read_only"),
    ("pytest -q", "local"),
    ("make build", "local"),
    ("git status; git push", NON),
])
def test_builtin_shell_rules(command, effect):
    decision = Policy().classify("bash", {"command": command})
    assert decision.effect == effect, decision.rule


def test_tool_names():
    p = Policy()
    assert p.classify("read_file", {"path": "x"}).effect == "read_only"
    assert p.classify("write_file", {"path": "x"}).effect == "local"
    assert p.classify("send_email", {}).effect == NON
    assert p.classify("mystery_tool", {}).effect == "local"
    assert p.classify("bash", {"command": ["git", "push"]}).effect == NON


def test_split_commands():
    assert split_commands("A=1 sudo /usr/bin/git push && echo $(curl x)") == [
        "git push", "echo", "curl x"]


def test_policy_file_rules_win(tmp_path):
    f = tmp_path / "policy.toml"
    f.write_text('''
shell_tools = ["run"]

[[tool]]
match = "deploy_*"
effect = "external_non_idempotent"
require_approval = true

[[command]]
match = "make release*"
effect = "external_non_idempotent"
require_approval = true
''')
    p = Policy.load(str(f))
    d = p.classify("deploy_prod", {})
    assert d.requires_approval and d.effect == NON and "tool[0]" in d.rule
    d = p.classify("run", {"command": "make release VERSION=1"})
    assert d.requires_approval and "command[0]" in d.rule
    assert not p.classify("run", {"command": "make test"}).requires_approval


@pytest.mark.parametrize("text", [
    "[[tool]]\nmatch = 'x'\neffect = 'nuclear'\n",
    "[[tool]]\neffect = 'local'\n",
    "[[tool]]\nmatch = 'x'\ncolour = 'red'\n",
    "unknown_key = 1\n",
    "[[tool]]\nmatch = 'x'\nrequire_approval = 'yes'\n",
    "this is not toml [",
])
def test_malformed_policy_files(tmp_path, text):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(InvalidArgument):
        Policy.load(str(f))
