"""Inputs a hostile user might hand the commands, shared by the tests that feed them in."""

# a YAML "billion laughs": nine aliases of nine aliases ... nine levels deep, 9^9 values once expanded
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))
