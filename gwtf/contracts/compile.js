// Compiles the GWTF Solidity sources with the pinned solc-js through its standard-JSON API and
// writes gwtf/contracts/artifacts.json: {compiler, evmVersion, sourcesSha256, contracts: {Name: {abi,
// bytecode}}}. `npx solcjs` has no --evm-version flag, hence this script. Imports of
// "@openzeppelin/..." resolve from node_modules. The sources hash is computed exactly as
// gwtf/contracts/artifacts.py computes it, so a stale artifacts file is detected by the tests.
"use strict";

const crypto = require("crypto");
const fs = require("fs");
const path = require("path");
const solc = require("solc");

const CONTRACTS_DIR = __dirname;
// Source names are relative to the gwtf package (contracts/X.sol), as gwtf/contracts/artifacts.py
// names them; node_modules lies at the repository root.
const SOURCE_ROOT = path.resolve(CONTRACTS_DIR, "..");
const REPO_ROOT = path.resolve(CONTRACTS_DIR, "..", "..");
const OUTPUT = path.join(CONTRACTS_DIR, "artifacts.json");
const EVM_VERSION = "prague"; // py-evm's newest fork; solc 0.8.37 defaults to osaka.

// Every .sol under gwtf/contracts/ (including gwtf/contracts/test/), as repo-relative POSIX paths, sorted so
// that the hash does not depend on directory listing order.
function listSources(dir) {
  const found = [];
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) found.push(...listSources(full));
    else if (entry.name.endsWith(".sol")) found.push(full);
  }
  return found;
}

function sourcesSha256(relPaths) {
  // sha256 over "path\0content\0" for each source in sorted order.
  const hash = crypto.createHash("sha256");
  for (const rel of relPaths) {
    hash.update(rel + "\0");
    hash.update(fs.readFileSync(path.join(SOURCE_ROOT, rel)));
    hash.update("\0");
  }
  return hash.digest("hex");
}

function findImport(importPath) {
  const candidates = [
    path.join(REPO_ROOT, "node_modules", importPath),
    path.join(SOURCE_ROOT, importPath),
  ];
  for (const candidate of candidates) {
    if (fs.existsSync(candidate)) return { contents: fs.readFileSync(candidate, "utf8") };
  }
  return { error: `import not found: ${importPath} (run \`npm ci\`)` };
}

function main() {
  const relPaths = listSources(CONTRACTS_DIR)
    .map((full) => path.relative(SOURCE_ROOT, full).split(path.sep).join("/"))
    .sort();
  const sources = {};
  for (const rel of relPaths) {
    sources[rel] = { content: fs.readFileSync(path.join(SOURCE_ROOT, rel), "utf8") };
  }
  const input = {
    language: "Solidity",
    sources,
    settings: {
      evmVersion: EVM_VERSION,
      optimizer: { enabled: true, runs: 200 },
      viaIR: true,
      outputSelection: { "*": { "*": ["abi", "evm.bytecode.object"] } },
    },
  };
  const output = JSON.parse(solc.compile(JSON.stringify(input), { import: findImport }));
  const errors = (output.errors || []).filter((e) => e.severity === "error");
  for (const diagnostic of output.errors || []) console.error(diagnostic.formattedMessage);
  if (errors.length > 0) process.exit(1);

  const contracts = {};
  for (const rel of relPaths) {
    for (const [name, compiled] of Object.entries(output.contracts[rel] || {})) {
      const bytecode = compiled.evm.bytecode.object;
      if (bytecode.length === 0 || compiled.abi.length === 0) continue; // interfaces, libraries
      contracts[name] = { source: rel, abi: compiled.abi, bytecode: "0x" + bytecode };
    }
  }
  const artifacts = {
    compiler: solc.version(),
    evmVersion: EVM_VERSION,
    sourcesSha256: sourcesSha256(relPaths),
    sources: relPaths,
    contracts,
  };
  fs.writeFileSync(OUTPUT, JSON.stringify(artifacts, null, 1) + "\n");
  for (const [name, c] of Object.entries(contracts)) {
    console.log(`${name}: ${(c.bytecode.length - 2) / 2} bytes of init code`);
  }
}

main();
