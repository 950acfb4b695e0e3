"""Pytrees: flatten / unflatten and the JSON form of tree definitions."""

import json
from dataclasses import dataclass

import numpy as np
import pytest

from mplang.edsl.pytree import LEAF, TreeDef, tree_flatten, tree_map, tree_unflatten


@dataclass
class Point:
    x: object
    y: object


@dataclass(frozen=True)
class Labeled:
    label: object
    point: object


def roundtrip(tree):
    leaves, treedef = tree_flatten(tree)
    return leaves, treedef, tree_unflatten(treedef, leaves)


@pytest.mark.parametrize(
    "tree, leaves",
    [
        (1, [1]),
        ((1, 2), [1, 2]),
        ([1, [2, 3]], [1, 2, 3]),
        ({"b": 2, "a": 1}, [1, 2]),  # dict leaves in sorted key order
        (None, []),
        ((None, 1, [None]), [1]),
        ((), []),
        ({}, []),
        ("text", ["text"]),
        ({"k": (1, {"z": 3, "y": [2]})}, [1, 2, 3]),
    ],
)
def test_flatten_unflatten(tree, leaves):
    got, treedef, back = roundtrip(tree)
    assert got == leaves
    assert back == tree
    assert type(back) is type(tree)
    assert treedef.num_leaves == len(leaves)


def test_tuple_and_list_are_distinguished():
    _, t1 = tree_flatten((1, 2))
    _, t2 = tree_flatten([1, 2])
    assert t1 != t2
    assert tree_unflatten(t1, ["a", "b"]) == ("a", "b")
    assert tree_unflatten(t2, ["a", "b"]) == ["a", "b"]


def test_none_is_structure_not_a_leaf():
    leaves, treedef = tree_flatten(None)
    assert leaves == []
    assert treedef.kind == "none"
    assert tree_unflatten(treedef, []) is None


def test_dict_keys_are_sorted_and_kept():
    leaves, treedef = tree_flatten({"z": 1, "a": 2, "m": 3})
    assert leaves == [2, 3, 1]
    assert treedef.meta == ("a", "m", "z")
    assert tree_unflatten(treedef, [10, 20, 30]) == {"a": 10, "m": 20, "z": 30}


def test_dict_insertion_order_does_not_change_the_treedef():
    _, t1 = tree_flatten({"a": 1, "b": 2})
    _, t2 = tree_flatten({"b": 2, "a": 1})
    assert t1 == t2


def test_dataclass_roundtrip():
    p = Point(1, (2, 3))
    leaves, treedef, back = roundtrip(p)
    assert leaves == [1, 2, 3]
    assert treedef.kind == "dataclass"
    assert treedef.meta[2] == ("x", "y")
    assert isinstance(back, Point)
    assert back == p


def test_nested_dataclasses_roundtrip():
    tree = Labeled("a", Point([1], {"k": 2}))
    leaves, _, back = roundtrip(tree)
    assert leaves == ["a", 1, 2]
    assert back == tree
    assert isinstance(back.point, Point)


def test_arrays_are_leaves():
    a = np.arange(3)
    leaves, treedef = tree_flatten({"a": a, "b": (a,)})
    assert len(leaves) == 2
    assert all(x is a for x in leaves)
    assert treedef.num_leaves == 2


def test_unflatten_with_new_leaves():
    _, treedef = tree_flatten({"a": (1, 2), "b": [3]})
    assert tree_unflatten(treedef, ["p", "q", "r"]) == {"a": ("p", "q"), "b": ["r"]}


def test_unflatten_leaf_count_must_match():
    _, treedef = tree_flatten((1, 2))
    with pytest.raises(ValueError, match="too few"):
        tree_unflatten(treedef, [1])
    with pytest.raises(ValueError, match="too many"):
        tree_unflatten(treedef, [1, 2, 3])


def test_tree_map():
    assert tree_map(lambda x: x * 10, {"a": (1, [2]), "b": None}) == {"a": (10, [20]), "b": None}


def test_leaf_treedef():
    assert tree_flatten(5)[1] == LEAF
    assert LEAF.num_leaves == 1


# ---------------------------------------------------------------- JSON form


@pytest.mark.parametrize(
    "tree",
    [
        1,
        None,
        (1, [2, None], {"a": 3, "b": (4,)}),
        [],
        {"only": None},
        Point(1, 2),
        Labeled("l", Point((1, 2), [3])),
        [Point(1, 2), {"p": Point(3, 4)}],
    ],
)
def test_treedef_json_roundtrip(tree):
    _, treedef = tree_flatten(tree)
    data = treedef.to_json()
    text = json.dumps(data)  # plain JSON-able data
    back = TreeDef.from_json(json.loads(text))
    assert back == treedef
    assert hash(back) == hash(treedef)
    leaves, _ = tree_flatten(tree)
    assert tree_unflatten(back, leaves) == tree


def test_treedef_json_shape():
    _, treedef = tree_flatten({"a": (1,)})
    assert treedef.to_json() == {
        "kind": "dict",
        "children": [{"kind": "tuple", "children": [{"kind": "leaf", "children": [],
                                                      "meta": []}], "meta": []}],
        "meta": ["a"],
    }


def test_dataclass_json_records_module_and_qualname():
    _, treedef = tree_flatten(Point(1, 2))
    module, qualname, fields = treedef.to_json()["meta"]
    assert module == Point.__module__
    assert qualname == "Point"
    assert list(fields) == ["x", "y"]


def test_dataclass_of_unloaded_module_unflattens_to_dict():
    # nothing is imported while decoding: an unknown class gives its fields as a dict
    data = {"kind": "dataclass", "children": [{"kind": "leaf", "children": [], "meta": []}],
            "meta": ["no_such_module_for_mplang_tests", "Ghost", ["v"]]}
    treedef = TreeDef.from_json(data)
    assert tree_unflatten(treedef, [7]) == {"v": 7}


@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        "leaf",
        {"kind": "leaf"},
        {"kind": "leaf", "children": [], "meta": [], "extra": 1},
        {"kind": "set", "children": [], "meta": []},
        {"kind": "tuple", "children": {}, "meta": []},
        {"kind": "tuple", "children": [], "meta": {}},
        {"kind": "tuple", "children": [{"kind": "bogus", "children": [], "meta": []}],
         "meta": []},
    ],
)
def test_treedef_from_json_rejects_malformed(data):
    with pytest.raises(ValueError, match="malformed"):
        TreeDef.from_json(data)
