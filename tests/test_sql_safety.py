"""No SQL built from strings in the package: every statement is a literal or a named one.

Parses every module of ``src/awa`` and finds the driver calls (``execute``,
``fetch``, ``fetchrow``, ``fetchval``, ``executemany``, ``copy_*``,
``cursor``, ``prepare``) whose SQL argument is built at run time: an
f-string, a ``%`` format, a ``+`` concatenation, ``.format()`` or
``.join()`` — directly, or through a local variable assigned one. A call that
is genuinely safe (validated identifiers only) carries a ``# sql-safe:``
comment with the reason on its line or the line above.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "awa"
DRIVER_CALLS = {"execute", "executemany", "fetch", "fetchrow", "fetchval", "fetch_one",
                "fetch_optional", "fetch_all", "prepare", "cursor", "copy_from_query",
                "copy_from_table", "copy_to_table", "copy_records_to_table"}
MARKER = "# sql-safe:"


def _built(node: ast.AST, tainted: set[str]) -> bool:
    """True if ``node`` builds a string at run time."""
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(v, ast.FormattedValue) for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
        return not (isinstance(node.left, ast.Constant) and isinstance(node.right, ast.Constant))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in {"format", "join", "replace", "format_map"}
    if isinstance(node, ast.Name):
        return node.id in tainted
    if isinstance(node, ast.IfExp):
        return _built(node.body, tainted) or _built(node.orelse, tainted)
    return False


def _tainted_names(func: ast.AST) -> set[str]:
    """Local names assigned a run-time-built string anywhere in ``func``."""
    tainted: set[str] = set()
    changed = True
    while changed:
        changed = False
        for node in ast.walk(func):
            targets: list[ast.expr] = []
            value: ast.AST | None = None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            elif isinstance(node, ast.AugAssign):
                targets, value = [node.target], node
            if value is None:
                continue
            is_built = (isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add)) \
                or _built(value, tainted)
            for t in targets:
                if isinstance(t, ast.Name) and is_built and t.id not in tainted:
                    tainted.add(t.id)
                    changed = True
    return tainted


def _sql_argument(call: ast.Call) -> ast.expr | None:
    if call.args:
        return call.args[0]
    for kw in call.keywords:
        if kw.arg in {"query", "sql", "command"}:
            return kw.value
    return None


def find_built_sql(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, code) of every driver call in ``source`` whose SQL is built at run time
    and not marked ``# sql-safe:``."""
    tree = ast.parse(source, filename)
    lines = source.splitlines()
    scopes: list[ast.AST] = [tree, *(n for n in ast.walk(tree)
                                     if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]
    found: dict[int, str] = {}
    for scope in scopes:
        tainted = _tainted_names(scope) if scope is not tree else set()
        for node in ast.walk(scope):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in DRIVER_CALLS):
                continue
            arg = _sql_argument(node)
            if arg is None or not _built(arg, tainted):
                continue
            here = lines[node.lineno - 1]
            above = lines[node.lineno - 2] if node.lineno > 1 else ""
            if MARKER in here or above.strip().startswith(MARKER):
                continue
            found[node.lineno] = here.strip()
    return sorted(found.items())


_SQL_START = re.compile(r"^\s*\(?\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|GRANT|REVOKE|"
                        r"TRUNCATE|WITH|COPY|SET|VACUUM|LISTEN|NOTIFY|EXECUTE)\s")


def _template(node: ast.AST) -> str | None:
    """The constant text that starts a run-time-built string, if ``node`` builds one."""
    if isinstance(node, ast.JoinedStr) and any(isinstance(v, ast.FormattedValue)
                                               for v in node.values):
        first = node.values[0]
        return first.value if isinstance(first, ast.Constant) else ""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add) \
            and isinstance(node.left, ast.Constant) and isinstance(node.left.value, str) \
            and not isinstance(node.right, ast.Constant):
        return node.left.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in {"format", "format_map"} \
            and isinstance(node.func.value, ast.Constant):
        return str(node.func.value.value)
    return None


def find_sql_templates(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, code) of every string that starts like SQL and is built at run time,
    wherever it is (not only in driver calls), unless marked ``# sql-safe:``."""
    lines = source.splitlines()
    found: dict[int, str] = {}
    for node in ast.walk(ast.parse(source, filename)):
        text = _template(node)
        if text is None or not _SQL_START.match(text):
            continue
        line = getattr(node, "lineno", 1)
        here, above = lines[line - 1], lines[line - 2] if line > 1 else ""
        if MARKER not in here and not above.strip().startswith(MARKER):
            found[line] = here.strip()
    return sorted(found.items())


def test_checker_catches_every_way_of_building_sql() -> None:
    source = '''
async def f(conn, name, schema):
    await conn.execute(f"SELECT * FROM {name}")
    await conn.fetch("SELECT * FROM %s" % name)
    await conn.fetchrow("SELECT * FROM " + name)
    await conn.fetchval("SELECT * FROM {}".format(name))
    sql = "DELETE FROM " + name
    await conn.execute(sql)
    other = sql
    await conn.executemany(other, [])
    await conn.execute(" ".join(["SELECT", name]))
    await conn.execute("SELECT $1", name)           # a literal with parameters: fine
    await conn.execute(q["job_insert"], name)       # a named statement: fine
    # sql-safe: schema is a validated identifier
    await conn.execute(f'CREATE SCHEMA "{schema}"')
'''
    assert [line for line, _ in find_built_sql(source)] == [3, 4, 5, 6, 8, 10, 11]


def test_checker_finds_sql_templates_outside_driver_calls() -> None:
    source = '''
def build(table, n):
    a = f"SELECT * FROM {table}"
    b = "DELETE FROM %s" % table
    c = "GRANT ALL ON {} TO x".format(table)
    d = f"{n} jobs updated"                     # prose: fine
    e = "SELECT 1"                              # a literal: fine
    # sql-safe: table is a validated identifier
    g = f"DROP TABLE {table}"
'''
    assert [line for line, _ in find_sql_templates(source)] == [3, 4, 5]


def test_no_sql_built_from_strings_in_the_package() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        found = dict(find_built_sql(source, str(path)))
        found.update(find_sql_templates(source, str(path)))
        for line, code in sorted(found.items()):
            problems.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {code}")
    assert not problems, "SQL built at run time (use a named statement and parameters, or " \
        f"justify with '{MARKER} <reason>'):\n" + "\n".join(problems)
