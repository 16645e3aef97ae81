// Builds OpenZeppelin StandardMerkleTrees from the leaf values on stdin (JSON {types, trees: [
// [values of leaf 0, ...], ...]}), keeping the leaves in the order given, and prints each tree's
// root, leaf hashes and proofs (JSON), so tests/contracts/test_merkle.py can compare the Python
// tree with OpenZeppelin's own package.
"use strict";

const { StandardMerkleTree } = require("@openzeppelin/merkle-tree");

let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  const { types, trees } = JSON.parse(input);
  const out = trees.map((values) => {
    const tree = StandardMerkleTree.of(values, types, { sortLeaves: false });
    return {
      root: tree.root,
      leaves: values.map((v) => tree.leafHash(v)),
      proofs: values.map((_, i) => tree.getProof(i)),
    };
  });
  process.stdout.write(JSON.stringify(out));
});
