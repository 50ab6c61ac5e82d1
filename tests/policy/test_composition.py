"""The policy by composition (issue 46): a training loop over a model adapter, no inheritance lattice, and no module
outside a backend reading a policy's private names.

Both checks walk the source's AST, so they see every class and every attribute read, and each is shown to fail
on the form it is for.
"""

import ast
from pathlib import Path

import rlkit

ROOT = Path(rlkit.__file__).parent
POLICY = ROOT / "policy"
# a backend's own modules, and the loop that holds its adapter, may read its private names
OWN = {POLICY / "hf.py", POLICY / "dtensor.py", POLICY / "in_process.py", *(POLICY / "megatron").rglob("*.py")}


def _classes(tree: ast.AST) -> list[ast.ClassDef]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]


def _base_name(base: ast.expr) -> str:
    base = base.value if isinstance(base, ast.Subscript) else base  # Protocol[T], Generic[T]
    return base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")


def _in_repo_classes() -> tuple[set[str], set[str]]:
    """Names of the classes defined in rlkit/, and of those that are Protocols."""
    names, protocols = set(), set()
    for path in ROOT.rglob("*.py"):
        for cls in _classes(ast.parse(path.read_text())):
            names.add(cls.name)
            if any(_base_name(b) == "Protocol" for b in cls.bases):
                protocols.add(cls.name)
    return names, protocols


def lattice_violations(source: str, names: set[str], protocols: set[str]) -> list[str]:
    """Classes of ``source`` with more than one in-repo base class that is not a Protocol."""
    found = []
    for cls in _classes(ast.parse(source)):
        bases = [n for b in cls.bases if (n := _base_name(b)) in names and n not in protocols]
        if len(bases) > 1:
            found.append(f"{cls.name}({', '.join(bases)})")
    return found


def _is_policy(node: ast.expr) -> bool:
    """Whether ``node`` names a policy: ``policy``, ``self.policy``, ``session.policy``, ``p_policy``..."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return "policy" in name.lower()


def _private(name) -> bool:
    return isinstance(name, str) and name.startswith("_") and not name.startswith("__")


def private_reads(source: str) -> list[str]:
    """``policy._x``, ``getattr(policy, "_x")``/``hasattr``/``setattr`` and ``vars(policy).get("_x")``/``["_x"]``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _private(node.attr) and _is_policy(node.value):
            found.append(f"{ast.unparse(node)} (line {node.lineno})")
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            fn = getattr(node.func, "id", "")
            if fn in ("getattr", "hasattr", "setattr") and _is_policy(node.args[0]) and _private(node.args[1].value):
                found.append(f"{ast.unparse(node)} (line {node.lineno})")
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            key, owner = node.args[0], node.func.value  # vars(policy).get("_x")
        elif isinstance(node, ast.Subscript):
            key, owner = node.slice, node.value  # vars(policy)["_x"]
        if (isinstance(key, ast.Constant) and _private(key.value) and isinstance(owner, ast.Call)
                and getattr(owner.func, "id", "") == "vars" and owner.args and _is_policy(owner.args[0])):
            found.append(f"{ast.unparse(node)} (line {node.lineno})")
    return found


def test_no_policy_class_has_more_than_one_in_repo_base_besides_a_protocol():
    names, protocols = _in_repo_classes()
    assert "ModelAdapter" in protocols  # (the adapters' base is the protocol they implement)
    found = [f"{path.relative_to(ROOT.parent)}: {v}" for path in sorted(POLICY.rglob("*.py"))
             for v in lattice_violations(path.read_text(), names, protocols)]
    assert not found, "a class with several in-repo bases (hold the parts instead):\n" + "\n".join(found)


def test_the_lattice_check_catches_a_mixin():
    names, protocols = {"A", "B", "P"}, {"P"}
    assert lattice_violations("class C(A, B): pass", names, protocols) == ["C(A, B)"]
    assert lattice_violations("class C(A, P): pass\nclass D(A, RuntimeError): pass", names, protocols) == []


def test_no_module_outside_a_backend_reads_a_private_name_of_a_policy():
    found = [f"{path.relative_to(ROOT.parent)}: {read}" for path in sorted(ROOT.rglob("*.py")) if path not in OWN
             for read in private_reads(path.read_text())]
    assert not found, "reads a policy's private name (give the policy a public one):\n" + "\n".join(found)


def test_the_private_read_check_catches_the_forms_it_is_for():
    for line in ("x = policy._reference", "policy._twin.pull()", "n = self.policy._grad_norm()",
                 'getattr(policy, "_twin", None)', 'vars(policy).get("_reference")', 'vars(session.policy)["_x"]'):
        assert private_reads(line), line
    for line in ("policy.reference.is_current = False", "self._export = self.policy.export_hf_groups()",
                 "policy.__class__", 'getattr(policy, "reference", None)', "x._y"):
        assert not private_reads(line), line
