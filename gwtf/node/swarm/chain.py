"""The chain of a local swarm: start or reach it, open the run, give every node a staked identity.

``gwtf-node swarm`` uses this before it starts any node process, and again for each joiner just
before it enters. What happens, with the transactions of ``gwtf.node.chain.actions``:

* the chain: a devnet started here as ``gwtf-node devnet`` starts it (anvil, a child process
  that ends with the swarm, on an ephemeral port; the embedded eth-tester chain where anvil is
  not installed) unless the swarm file names ``[chain] rpc_url``; then the contracts named by
  ``[chain] devnet_file`` are used, or the suite is deployed there (which needs an unlocked dev
  account, as anvil has);
* the run: the sponsor (the chain's first dev account) opens it with the reward pool;
* each node: a node key (``wallets/<name>.node-main.json``, the layout of ``gwtf-node
  register``; one random password for the swarm in ``wallets/password``, mode 0600, never
  logged), which is also its libp2p identity. A relay gets a wallet keystore
  (``wallets/<name>.json``) funded by the sponsor, is registered with a stake and joins the run;
  a data node is registered by the sponsor's own wallet and named a data node of the run.

A node that was never registered (a "stranger", for admission tests) only gets its key; so does
every node of a swarm without a chain.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from eth_account import Account
from eth_account.signers.local import LocalAccount

from gwtf.errors import ChainError, ConfigError
from gwtf.node.chain.actions import (
    DATASET_HASH,
    Capacity,
    Contracts,
    RunConfig,
    RunModel,
    add_data_node,
    join_run,
    model_config_hash,
    open_run,
    register_node,
    transfer_eth,
)
from gwtf.node.chain.adapter import Sender, connect
from gwtf.node.chain.deployment import DevnetInfo, read_devnet_file
from gwtf.node.chain.wallet import (
    create_wallet,
    import_key,
    load_or_create_node_key,
    node_key_path,
    open_wallet,
)
from gwtf.node.devnet.server import RunningDevnet, start_devnet
from gwtf.node.p2p.identity import identity_from_key, node_address_of_peer, peer_id_of
from gwtf.node.settings import ENV_PREFIX, ENV_RPC_TOKEN

WEI_PER_ETH = 10**18
#: Every transaction gets this fixed gas limit after a revert-checking call: eth-tester's gas
#: estimator searches for ~0.8 s per transaction (registerNode uses ~243k, openRun ~149k).
SWARM_GAS_LIMIT = 2_000_000
#: scrypt cost of the swarm's keystores on its own devnet (they hold devnet ETH only): ~60 ms
#: per keystore instead of ~1 s at eth-account's default, which a chain named by rpc_url keeps.
DEVNET_SCRYPT_N = 2**14


@dataclass(frozen=True)
class ChainPlan:
    """The ``[chain]`` section of a swarm file."""

    enabled: bool = True
    rpc_url: str = ""
    #: The IP address the swarm's own devnet serves on, which every node dials: loopback keeps
    #: the chain to this machine; nodes on other hosts need an address they can route to.
    host: str = "127.0.0.1"
    devnet_file: str = ""
    stake_eth: float = 2.0
    reward_pool_eth: float = 10.0
    fund_eth: float = 3.0
    #: What each certified forward hop earns (the run's price; a backward earns twice).
    hop_price_eth: float = 0.0001
    epoch_length_s: int = 3600
    #: Epochs the training spans: the devnet's clock is moved on one epoch at each of the
    #: iterations' equal parts, then past the last epoch's end and its dispute window, so that
    #: every node's receipts are certified and claimed before the swarm ends.
    epochs: int = 1
    #: Receipts on every hop and the epoch cycle (``chain.receipts`` of every node).
    receipts: bool = True
    #: Hops of each certificate the swarm's audit re-executes from the relays' evidence.
    audit_sample: int = 32

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> ChainPlan:
        plan = cls(**section)
        if not isinstance(plan.enabled, bool):
            raise ConfigError(f"[chain] enabled={plan.enabled!r} must be true or false")
        if plan.rpc_url and not plan.rpc_url.startswith(("http://", "https://")):
            raise ConfigError(f"[chain] rpc_url={plan.rpc_url!r} must be an http(s):// URL")
        if not _is_host_ip(plan.host):
            raise ConfigError(
                f"[chain] host={plan.host!r} must be an IP address of this machine that the "
                "nodes can dial (not 0.0.0.0)"
            )
        if plan.devnet_file and not plan.rpc_url:
            raise ConfigError("[chain] devnet_file needs rpc_url: name the chain it describes")
        for name in ("stake_eth", "reward_pool_eth", "fund_eth", "hop_price_eth"):
            if not isinstance(getattr(plan, name), int | float) or getattr(plan, name) <= 0:
                raise ConfigError(f"[chain] {name}={getattr(plan, name)!r} must be above 0")
        if not isinstance(plan.epochs, int) or plan.epochs < 1:
            raise ConfigError(f"[chain] epochs={plan.epochs!r} must be a whole number from 1")
        if not isinstance(plan.audit_sample, int) or plan.audit_sample < 0:
            raise ConfigError(f"[chain] audit_sample={plan.audit_sample!r} must be a whole number")
        if not isinstance(plan.receipts, bool):
            raise ConfigError(f"[chain] receipts={plan.receipts!r} must be true or false")
        if plan.fund_eth <= plan.stake_eth:
            raise ConfigError(
                f"[chain] fund_eth={plan.fund_eth} must exceed stake_eth={plan.stake_eth} "
                "(the stake plus gas)"
            )
        return plan


@dataclass(frozen=True)
class RegisteredNode:
    name: str
    wallet: str
    node_address: str
    peer_id: str  # base58, as libp2p prints it

    def as_json(self) -> dict[str, str]:
        return {
            "node": self.name,
            "wallet": self.wallet,
            "node_address": self.node_address,
            "peer_id": self.peer_id,
        }


@dataclass
class SwarmChain:
    """The swarm's chain once it is up and its run is open."""

    contracts: Contracts
    sponsor: Sender
    run_id: int
    rpc_url: str
    devnet_file: Path
    wallets_dir: Path
    plan: ChainPlan
    scrypt_n: int | None
    devnet: RunningDevnet | None = None
    registered: dict[str, RegisteredNode] = field(default_factory=dict)
    _password: str = field(default="", repr=False)

    def peer_id_of(self, name: str) -> str:
        """The node's libp2p id (its key is created here if it has none yet)."""
        return peer_id_of_node(self.wallets_dir.parent, name, self.scrypt_n)

    def wallet_file(self, name: str, *, data_node: bool = False) -> Path:
        """The keystore of the wallet behind node ``name`` (created, unfunded, if missing): a
        relay's own, a data node's the sponsor's. The node claims or submits with it."""
        if data_node:
            path = self.wallets_dir / "sponsor.json"
            if not path.exists():
                if self.sponsor.account is None:
                    raise ChainError(
                        "the sponsor's key is not known (an unlocked account): a data node "
                        "cannot submit its certificates; use the embedded devnet or anvil"
                    )
                key = bytes(self.sponsor.account.key)
                import_key(path, key, self._password, scrypt_n=self.scrypt_n)
            return path
        path = self.wallets_dir / f"{name}.json"
        if not path.exists():
            create_wallet(path, self._password, scrypt_n=self.scrypt_n)
        return path

    def register(self, name: str, capacity: int, *, data_node: bool = False) -> RegisteredNode:
        """Put the node in the run, staked: a relay is funded, registered by its own wallet and
        joins; a data node is registered by the sponsor and named a data node of the run."""
        c = self.contracts
        node_key = ensure_node_key(self.wallets_dir.parent, name, self.scrypt_n)
        if data_node:
            wallet = self.sponsor
        else:
            wallet_path = self.wallets_dir / f"{name}.json"
            if wallet_path.exists():
                account = open_wallet(wallet_path, self._password)
            else:
                account = create_wallet(wallet_path, self._password, scrypt_n=self.scrypt_n)
            wallet = Sender.from_account(account)
            transfer_eth(c.w3, self.sponsor, wallet.address, _wei(self.plan.fund_eth))
        if c.port().node_info(node_key.address) is None:
            hardware = Capacity("cpu", 1024, 3600, capacity)
            register_node(c, wallet, bytes(node_key.key), hardware, _wei(self.plan.stake_eth))
        if data_node:
            add_data_node(c, self.sponsor, self.run_id, node_key.address)
        else:
            join_run(c, wallet, self.run_id, node_key.address)
        peer_id = str(peer_id_of(identity_from_key(bytes(node_key.key))))
        node = RegisteredNode(name, wallet.address, node_key.address, peer_id)
        self.registered[name] = node
        return node

    def is_member(self, peer_id: str) -> bool:
        """Whether the chain admits the peer to the swarm's run now."""
        from libp2p.peer.id import ID

        node = node_address_of_peer(ID.from_base58(peer_id))
        return self.contracts.port().is_admitted(self.run_id, node)

    def stop(self) -> None:
        if self.devnet is not None:
            self.devnet.stop()  # and removes the devnet file: its addresses die with the chain


def _wei(eth: float) -> int:
    # Through the decimal text, so 0.1 ETH is exactly 10**17 wei.
    return int(Decimal(str(eth)) * WEI_PER_ETH)


def start_swarm_chain(
    plan: ChainPlan,
    out_dir: Path,
    run: RunModel,
    dataset_hash: bytes,
    log: IO[bytes] | None,
    *,
    backend: str = "auto",
) -> SwarmChain:
    """Start (or reach) the chain and open the swarm's run on it; ``backend`` is the devnet's,
    as ``gwtf-node devnet --backend`` takes it."""
    devnet_file = out_dir / "devnet.json"
    devnet: RunningDevnet | None = None
    try:
        if plan.rpc_url and plan.devnet_file:
            info = read_devnet_file(plan.devnet_file)
            devnet_file.write_text(Path(plan.devnet_file).read_text())
        else:
            running = start_devnet(plan.host, 0, plan.rpc_url or None, devnet_file, backend=backend)
            info = running.info
            if running.chain is not None:  # ours, not the chain at rpc_url
                devnet = running
                if log is not None:
                    log.write(f"devnet: {running.chain.name} at {info.rpc_url}\n".encode())
        rpc_url = plan.rpc_url or info.rpc_url
        contracts = Contracts.at(connect(rpc_url), info.contracts, gas_limit=SWARM_GAS_LIMIT)
        scrypt_n = None if plan.rpc_url else DEVNET_SCRYPT_N
        chain = open_swarm_run(
            contracts, sponsor_of(info), plan, out_dir, run, dataset_hash, scrypt_n=scrypt_n
        )
    except BaseException:
        if devnet is not None:
            devnet.stop()
        raise
    chain.rpc_url, chain.devnet_file, chain.devnet = rpc_url, devnet_file, devnet
    return chain


def open_swarm_run(
    contracts: Contracts,
    sponsor: Sender,
    plan: ChainPlan,
    out_dir: Path,
    run: RunModel,
    dataset_hash: bytes = bytes(DATASET_HASH),
    *,
    scrypt_n: int | None = DEVNET_SCRYPT_N,
) -> SwarmChain:
    """Open the swarm's run (``run`` on the data set ``dataset_hash``) with its reward pool
    on deployed contracts (any chain)."""
    run_id = open_run(
        contracts, sponsor, _run_config(plan, run, dataset_hash), _wei(plan.reward_pool_eth)
    )
    return SwarmChain(
        contracts,
        sponsor,
        run_id,
        rpc_url="",
        devnet_file=out_dir / "devnet.json",
        wallets_dir=_wallets_dir(out_dir),
        plan=plan,
        scrypt_n=scrypt_n,
        _password=_swarm_password(out_dir),
    )


def _run_config(plan: ChainPlan, run: RunModel, dataset_hash: bytes) -> RunConfig:
    return RunConfig(
        model_config_hash=model_config_hash(run),
        dataset_hash=dataset_hash,
        stage_count=run.stages,
        epoch_length_s=plan.epoch_length_s,
        units_per_hop=10,
        reward_per_epoch_wei=_wei(plan.reward_pool_eth) // 10,
        # Every epoch's fraud proofs are still open when the swarm audits, after the last.
        challenge_window_s=plan.epochs * plan.epoch_length_s,
        min_stake_wei=_wei(plan.stake_eth),
        hop_price_wei=_wei(plan.hop_price_eth),
    )


def sponsor_of(info: DevnetInfo) -> Sender:
    """The run's sponsor: the chain's first dev account, by its key when the devnet gave it."""
    if not info.accounts:
        raise ChainError(
            f"the chain at {info.rpc_url} lists no dev account to sponsor the run; use anvil or "
            "the embedded devnet"
        )
    account = info.accounts[0]
    if account.private_key:
        return Sender.from_account(Account.from_key(account.private_key))
    return Sender.unlocked(account.address)


#: The log section's variables (``gwtf.node.settings``' ``GWTF_<SECTION>_<FIELD>``).
_ENV_LOG = (f"{ENV_PREFIX}LOG_LEVEL", f"{ENV_PREFIX}LOG_JSON")


def child_env() -> dict[str, str]:
    """The environment of the swarm's processes: their command lines and settings files say
    everything, so ``GWTF_*`` variables of the caller's shell (which outrank a settings file)
    are left out, except the RPC token a chain named by ``rpc_url`` may need and the log
    settings (``GWTF_LOG_LEVEL=debug gwtf-node swarm …`` shows every node's debug lines)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    for kept in (ENV_RPC_TOKEN, *_ENV_LOG):
        if kept in os.environ:
            env[kept] = os.environ[kept]
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _wallets_dir(out_dir: Path) -> Path:
    wallets = out_dir / "wallets"
    wallets.mkdir(parents=True, exist_ok=True)
    os.chmod(wallets, 0o700)
    return wallets


def password_file(out_dir: Path) -> Path:
    """The file holding the swarm's keystore password, created with a random one if missing."""
    path = _wallets_dir(out_dir) / "password"
    if not path.exists():
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(24) + "\n")
    return path


def _swarm_password(out_dir: Path) -> str:
    """The keystores' password: read back if this folder has one, else a new random one."""
    return password_file(out_dir).read_text().strip()


def node_key_file(out_dir: Path, name: str) -> Path:
    """Where the swarm keeps node ``name``'s key (the layout of ``gwtf-node register``)."""
    return node_key_path(_wallets_dir(out_dir) / f"{name}.json", "main")


def ensure_node_key(
    out_dir: Path, name: str, scrypt_n: int | None = DEVNET_SCRYPT_N
) -> LocalAccount:
    """Node ``name``'s key, created on first use (so the node process only opens it)."""
    return load_or_create_node_key(
        node_key_file(out_dir, name), _swarm_password(out_dir), scrypt_n=scrypt_n
    )


def peer_id_of_node(out_dir: Path, name: str, scrypt_n: int | None = DEVNET_SCRYPT_N) -> str:
    """Node ``name``'s libp2p id (its key is created if it has none yet)."""
    key = ensure_node_key(out_dir, name, scrypt_n)
    return str(peer_id_of(identity_from_key(bytes(key.key))))


def chain_facts(
    chain: SwarmChain | None,
    strangers: dict[str, str],
    statuses: dict[str, dict[str, Any] | None],
) -> dict[str, Any]:
    """What the chain did for a swarm, and whom its nodes refused (from their status files);
    ``strangers`` maps the names of never-registered nodes to their libp2p ids."""
    if chain is None:
        return {"enabled": False}
    names = {node.peer_id: name for name, node in chain.registered.items()}
    names.update({peer_id: name for name, peer_id in strangers.items()})
    refusals: dict[str, dict[str, int]] = {}
    for name, status in statuses.items():
        for peer_id, count in (status or {}).get("refused", {}).items():
            refusals.setdefault(peer_id, {})[name] = int(count)
    return {
        "enabled": True,
        "rpc_url": chain.rpc_url,
        "run_id": chain.run_id,
        "registered_nodes": [node.as_json() for node in chain.registered.values()],
        "refused_peers": [
            {
                "peer_id": peer_id,
                "node": names.get(peer_id),
                "registered": any(n.peer_id == peer_id for n in chain.registered.values()),
                "refused_by": by_node,
            }
            for peer_id, by_node in sorted(refusals.items())
        ],
        "strangers": {
            name: {
                "peer_id": peer_id,
                "hops_recorded": (statuses.get(name) or {}).get("hops_recorded"),
            }
            for name, peer_id in strangers.items()
        },
    }


def _is_host_ip(host: object) -> bool:
    try:
        return isinstance(host, str) and not ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False
