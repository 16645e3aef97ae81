// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {Ownable2Step} from "@openzeppelin/contracts/access/Ownable2Step.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {Checkpoints} from "@openzeppelin/contracts/utils/structs/Checkpoints.sol";
import {NodeRegistry} from "./NodeRegistry.sol";

/// @notice What the court calls back with its final ruling (ERC-792's arbitrable side).
interface IArbitrable {
    function rule(uint256 caseId, uint256 ruling) external;
}

/// @title Court
/// @notice A drawn, staked jury of re-executors for the one fraud no contract can judge: a
/// wrong tensor. Registered, active nodes opt in as jurors by locking a deposit. The arbitrable
/// contract (Disputes, named once) opens a case and pays the first jury's fees; the case's
/// randomness mixes a future block's beacon with a salt the challenger committed at opening
/// and a salt the accused may give in the clear before the challenger reveals (so neither party
/// alone can steer the draw, and a challenger that does not reveal loses). A wallet has one
/// juror node. 3 seats are drawn in proportion to deposit as it stood when the draw's seed
/// block was armed (before its beacon could be known), exactly, with the jurors of
/// the parties, of their wallets and of the run's sponsor taken out of the draw; they
/// re-execute the hop off chain from the evidence the worker's side serves and vote by
/// commit-reveal: 1 the tensor is right, 2 it is wrong. Anyone may fund an appeal to 7, 15 and
/// 31 jurors (final). Each seat earns the same fee whichever side wins, paid only when its
/// revealed vote matches the final ruling; an absent or incoherent seat's penalty (20 fees)
/// is burned with its unpaid fee. Every step has a deadline in blocks and an outcome for
/// silence, so every case ends and nobody here profits from a ruling's direction.
contract Court is Ownable2Step, ReentrancyGuard {
    using Checkpoints for Checkpoints.Trace208;

    /// @notice Where a draw's beacon comes from: the hash of the seed block (readable for 256
    /// blocks), or the `prevrandao` of the block the draw lands in, within a few blocks of the
    /// seed block.
    enum Source {
        Blockhash,
        Prevrandao
    }

    enum Phase {
        None,
        Salts, // the accused may give its salt; then the challenger reveals its own
        Drawing, // the round's jury waits for its seed block (and a large enough pool)
        Voting, // commit, reveal and (before the final round) appeal windows
        Ruled
    }

    /// @notice The parties of a case, as the arbitrable names them.
    struct Parties {
        address accused; // the accused node
        address accusedWallet; // its wallet
        address challenger; // who opened the dispute (and paid the first jury)
        address sponsor; // the run's sponsor: never on a jury
        bytes32 challengerSaltHash; // keccak256(abi.encode(salt)) of the challenger's salt
    }

    struct Case {
        Parties parties;
        address arbitrable;
        uint64 openedAt;
        Phase phase;
        bool answered;
        uint8 ruling;
        bytes32 accusedSalt;
        bytes32 challengerSalt;
    }

    struct Round {
        uint64 seedBlock;
        uint64 drawBy; // after this block an undrawn round ends without a jury
        uint64 drawnAt; // 0 until drawn
        uint8 size;
        uint16 votesRight;
        uint16 votesWrong;
        uint128 feesWei;
        address funder;
        address[] seats;
    }

    struct Vote {
        bytes32 commitment;
        uint8 seats;
        uint8 choice; // 0: not revealed
    }

    /// @dev `weightWei` is what the draw tree holds for the juror: its deposit while it is not
    /// evicted and covers a penalty, else 0. Locks never change it: a seat checks the free
    /// deposit when it is drawn.
    struct Juror {
        address wallet;
        uint96 depositWei;
        uint96 lockedWei;
        uint32 slot; // 1-based place in the draw tree; 0 before the first deposit
        bool evicted; // its node left the registry's active set
        uint96 weightWei;
    }

    uint256 public constant REFUSED = 0; // no jury could be drawn
    uint256 public constant RIGHT = 1; // the tensor is right: the worker wins
    uint256 public constant WRONG = 2; // the tensor is wrong: the worker is convicted
    /// @notice A seat's penalty for absence or incoherence, in fees: lazy voting loses money.
    uint256 public constant PENALTY_FEES = 20;
    /// @notice Round r has 2^(r+2) - 1 seats: 3, 7, 15, 31 (final).
    uint256 public constant FINAL_ROUND = 3;
    uint256 public constant MAX_JURORS = 4096;
    /// @notice Blocks after its seed block a `prevrandao` draw may land in; later, it re-arms.
    uint256 public constant PREVRANDAO_WINDOW = 4;
    /// @notice A round not drawn this many phases after its first seed block ends without a jury.
    uint256 public constant DRAW_PATIENCE_PHASES = 4;
    /// @notice Points tried for one seat before the draw gives up (JuryNotDrawable): a point
    /// that hits a juror unable to sit now (inactive node, no free penalty) moves on.
    uint256 public constant SEAT_TRIES = 16;

    NodeRegistry public immutable registry;
    Source public immutable source;
    /// @notice What one seat earns for a coherent vote.
    uint256 public immutable feeWei;
    /// @notice Length of each window (answer, salt reveal, commit, vote reveal, appeal), in blocks.
    uint256 public immutable phaseBlocks;
    /// @notice Blocks between the last party input and the seed block.
    uint256 public immutable drawDelayBlocks;
    /// @notice Fewest distinct jurors (each with a penalty's deposit free) for a draw.
    uint256 public immutable minPool;

    /// @notice The only contract that opens cases; named once by the owner.
    address public arbitrable;
    uint256 public caseCount;
    /// @notice Jurors the draw can hit (weight above 0).
    uint256 public poolSize;
    /// @notice Sum of the jurors' weights: the draw tree's total.
    uint256 public totalWeightWei;
    /// @notice Penalties and unpaid fees that nobody will ever withdraw.
    uint256 public burnedWei;

    mapping(uint256 caseId => Case) internal _cases;
    mapping(uint256 caseId => Round[]) internal _rounds;
    mapping(uint256 caseId => mapping(uint256 round => mapping(address node => Vote))) public votes;
    mapping(address node => Juror) public jurors;
    /// @notice Each wallet's one juror node.
    mapping(address wallet => address node) public jurorOf;
    mapping(uint256 slot => address node) public jurorAt;
    uint256 public slotCount;
    /// @dev Fenwick tree over slots of each juror's weight, each node checkpointed by block: a
    /// draw reads the tree as it stood when its seed block was armed.
    mapping(uint256 index => Checkpoints.Trace208) internal _tree;
    mapping(address node => Checkpoints.Trace208) internal _weightAt;
    Checkpoints.Trace208 internal _totalAt;
    Checkpoints.Trace208 internal _poolAt;
    /// @notice Fees and refunds owed, withdrawn with withdrawCredit.
    mapping(address account => uint256) public creditWei;

    event ArbitrableSet(address indexed arbitrable);
    event JurorDeposited(address indexed node, address indexed wallet, uint256 amountWei, uint256 depositWei);
    event JurorWithdrew(address indexed node, uint256 amountWei, uint256 depositWei);
    event JurorEvicted(address indexed node);
    event CaseCreated(uint256 indexed caseId, address indexed accused, address indexed challenger, uint256 feesWei);
    event Answered(uint256 indexed caseId, bytes32 salt);
    event SaltRevealed(uint256 indexed caseId, bytes32 salt, uint256 seedBlock);
    event DrawRearmed(uint256 indexed caseId, uint256 round, uint256 seedBlock);
    event JuryDrawn(uint256 indexed caseId, uint256 round, address[] seats);
    event VoteCommitted(uint256 indexed caseId, uint256 round, address indexed node);
    event VoteRevealed(uint256 indexed caseId, uint256 round, address indexed node, uint256 choice);
    event AppealFunded(uint256 indexed caseId, uint256 round, address indexed funder, uint256 feesWei);
    event JurorSettled(uint256 indexed caseId, uint256 round, address indexed node, bool coherent, uint256 amountWei);
    event CaseRuled(uint256 indexed caseId, uint256 ruling);
    event CreditWithdrawn(address indexed account, uint256 amountWei);

    error ArbitrableAlreadySet(address arbitrable);
    error ZeroAddress();
    error FeeOutOfRange(uint256 feeWei);
    error BlocksOutOfRange(uint256 blocks);
    error PoolOutOfRange(uint256 minPool);
    error DepositOverflow(uint256 depositWei);
    error NotArbitrable(address caller);
    error WrongFee(uint256 sentWei, uint256 feeWei);
    error NotNodeWallet(address node, address caller);
    error NodeNotActive(address node);
    error JuryFull(uint256 maxJurors);
    error OneJurorPerWallet(address wallet, address juror);
    error JurorActive(address node);
    error ZeroAmount();
    error DepositLocked(address node, uint256 freeWei);
    error WrongPhase(uint256 caseId, Phase phase);
    error NotParty(uint256 caseId, address caller);
    error OutsideWindow(uint256 caseId, uint256 fromBlock, uint256 toBlock);
    error WrongSalt(uint256 caseId);
    error PoolTooSmall(uint256 poolSize, uint256 minPool);
    error JuryNotDrawable(uint256 caseId, uint256 seat);
    error NotJuror(uint256 caseId, address node);
    error AlreadyCommitted(uint256 caseId, address node);
    error BadVote(uint256 caseId, address node);
    error NoAppeal(uint256 caseId);
    error NotYet(uint256 caseId, uint256 fromBlock);
    error NothingToWithdraw(address account);
    error TransferFailed(address to, uint256 amountWei);

    /// @param registry_ The NodeRegistry: only its active nodes serve, paid to their wallets.
    /// @param owner_ Names the arbitrable once.
    /// @param source_ The beacon the draws mix in.
    /// @param feeWei_ A coherent seat's fee (non-zero, a penalty fits a uint96).
    /// @param phaseBlocks_ Each window's length in blocks (1..2^32).
    /// @param drawDelayBlocks_ Blocks from the last party input to the seed block (1..2^32).
    /// @param minPool_ Fewest distinct jurors to draw from (at least 3).
    constructor(
        NodeRegistry registry_,
        address owner_,
        Source source_,
        uint256 feeWei_,
        uint256 phaseBlocks_,
        uint256 drawDelayBlocks_,
        uint256 minPool_
    ) Ownable(owner_) {
        if (feeWei_ == 0 || feeWei_ * PENALTY_FEES > type(uint96).max) revert FeeOutOfRange(feeWei_);
        if (phaseBlocks_ == 0 || phaseBlocks_ > type(uint32).max) revert BlocksOutOfRange(phaseBlocks_);
        if (drawDelayBlocks_ == 0 || drawDelayBlocks_ > type(uint32).max) revert BlocksOutOfRange(drawDelayBlocks_);
        if (minPool_ < 3 || minPool_ > MAX_JURORS) revert PoolOutOfRange(minPool_);
        registry = registry_;
        source = source_;
        feeWei = feeWei_;
        phaseBlocks = phaseBlocks_;
        drawDelayBlocks = drawDelayBlocks_;
        minPool = minPool_;
    }

    /// @notice Names the contract that opens cases. Once, by the owner.
    /// @param arbitrable_ The Disputes address.
    function setArbitrable(address arbitrable_) external onlyOwner {
        if (arbitrable != address(0)) revert ArbitrableAlreadySet(arbitrable);
        if (arbitrable_ == address(0)) revert ZeroAddress();
        arbitrable = arbitrable_;
        emit ArbitrableSet(arbitrable_);
    }

    // ---------------------------------------------------------------- jurors

    /// @notice Adds `msg.value` to an active node's juror deposit, by the node's wallet (one
    /// juror node per wallet, for good). A juror is drawn in proportion to its deposit as it
    /// stood when the draw's seed block was armed; a drawn seat sits only while the node is
    /// active in the registry and a penalty (`penaltyWei`) of its deposit is free. A deposit
    /// also returns an evicted juror to later draws.
    /// @param node The juror node.
    function deposit(address node) external payable nonReentrant {
        (address wallet,, NodeRegistry.NodeStatus status) = registry.bondOf(node);
        if (wallet != msg.sender) revert NotNodeWallet(node, msg.sender);
        if (status != NodeRegistry.NodeStatus.Active) revert NodeNotActive(node);
        if (msg.value == 0) revert ZeroAmount();
        address current = jurorOf[wallet];
        // A wallet keeps its one juror node for good, so that the parties' juror nodes taken
        // out of a draw are the same whenever it is drawn.
        if (current != node && current != address(0)) revert OneJurorPerWallet(wallet, current);
        jurorOf[wallet] = node;
        Juror storage juror = jurors[node];
        if (juror.slot == 0) {
            if (slotCount == MAX_JURORS) revert JuryFull(MAX_JURORS);
            juror.slot = uint32(++slotCount);
            juror.wallet = wallet;
            jurorAt[juror.slot] = node;
        }
        uint256 after_ = uint256(juror.depositWei) + msg.value;
        if (after_ > type(uint96).max) revert DepositOverflow(after_);
        juror.depositWei = uint96(after_);
        juror.evicted = false;
        _reweigh(juror, node);
        emit JurorDeposited(node, wallet, msg.value, after_);
    }

    /// @notice Takes a juror whose node left the registry's active set out of later draws (its
    /// deposit stays its own). Anyone may call; meanwhile a draw that hits it moves on.
    /// @param node The juror node.
    function evict(address node) external {
        Juror storage juror = jurors[node];
        if (juror.slot == 0 || juror.evicted || registry.isActive(node)) revert JurorActive(node);
        juror.evicted = true;
        _reweigh(juror, node);
        emit JurorEvicted(node);
    }

    /// @notice Sends the free part (not locked by seats of open cases) of a juror's deposit,
    /// up to `amountWei`, to its wallet.
    /// @param node The juror node.
    /// @param amountWei How much to withdraw.
    function withdrawDeposit(address node, uint256 amountWei) external nonReentrant {
        Juror storage juror = jurors[node];
        if (juror.wallet != msg.sender) revert NotNodeWallet(node, msg.sender);
        if (amountWei == 0) revert ZeroAmount();
        uint256 free = uint256(juror.depositWei) - juror.lockedWei;
        if (amountWei > free) revert DepositLocked(node, free);
        uint256 left = uint256(juror.depositWei) - amountWei;
        juror.depositWei = uint96(left);
        _reweigh(juror, node);
        emit JurorWithdrew(node, amountWei, left);
        _send(msg.sender, amountWei);
    }

    // ---------------------------------------------------------------- cases

    /// @notice What opening a case costs: the first jury's fees.
    function arbitrationCost() public view returns (uint256) {
        return sizeOf(0) * feeWei;
    }

    /// @notice Opens a case for the arbitrable, which pays `arbitrationCost()`. The accused
    /// may give its salt for `phaseBlocks`; the challenger reveals its own after that (or
    /// after the accused's answer), within the next `phaseBlocks`.
    /// @param parties Who is accused, who accuses, and who may not sit.
    /// @return caseId The case's number (from 1).
    function createDispute(Parties calldata parties) external payable nonReentrant returns (uint256 caseId) {
        if (msg.sender != arbitrable) revert NotArbitrable(msg.sender);
        if (msg.value != arbitrationCost()) revert WrongFee(msg.value, arbitrationCost());
        caseId = ++caseCount;
        Case storage c = _cases[caseId];
        c.parties = parties;
        c.arbitrable = msg.sender;
        c.openedAt = uint64(block.number);
        c.phase = Phase.Salts;
        Round storage first = _rounds[caseId].push();
        first.size = uint8(sizeOf(0));
        first.feesWei = uint128(msg.value);
        first.funder = parties.challenger;
        emit CaseCreated(caseId, parties.accused, parties.challenger, msg.value);
    }

    /// @notice The accused's salt, in the clear, by the accused node or its wallet, within
    /// `phaseBlocks` of the opening. Optional: it keeps a challenger from choosing its jury by
    /// its salt where the chain's beacon is weak.
    /// @param caseId The case.
    /// @param salt Any value the accused chooses.
    function answer(uint256 caseId, bytes32 salt) external {
        Case storage c = _inPhase(caseId, Phase.Salts);
        if (msg.sender != c.parties.accused && msg.sender != c.parties.accusedWallet) {
            revert NotParty(caseId, msg.sender);
        }
        uint256 until = uint256(c.openedAt) + phaseBlocks;
        if (c.answered || block.number > until) revert OutsideWindow(caseId, c.openedAt, until);
        c.answered = true;
        c.accusedSalt = salt;
        emit Answered(caseId, salt);
    }

    /// @notice The challenger's salt, committed at opening, revealed once the accused has
    /// answered or could no longer, within `phaseBlocks` after that. Fixes the seed block
    /// `drawDelayBlocks` later. A challenger that does not reveal loses (see executeRuling).
    /// @param caseId The case.
    /// @param salt The salt whose keccak256(abi.encode(salt)) the challenger committed.
    function revealSalt(uint256 caseId, bytes32 salt) external {
        Case storage c = _inPhase(caseId, Phase.Salts);
        if (msg.sender != c.parties.challenger) revert NotParty(caseId, msg.sender);
        uint256 from = c.answered ? 0 : uint256(c.openedAt) + phaseBlocks + 1;
        uint256 until = uint256(c.openedAt) + 2 * phaseBlocks;
        if (block.number < from || block.number > until) revert OutsideWindow(caseId, from, until);
        if (keccak256(abi.encode(salt)) != c.parties.challengerSaltHash) revert WrongSalt(caseId);
        c.challengerSalt = salt;
        c.phase = Phase.Drawing;
        Round storage round = _rounds[caseId][0];
        _armDraw(round);
        emit SaltRevealed(caseId, salt, round.seedBlock);
    }

    /// @notice Draws the current round's jury once its seed block is past. Anyone may call.
    /// The draw reads the juror weights, total and pool as they stood at the end of the block
    /// that armed the seed block (`seedBlock - drawDelayBlocks`), before its beacon could be
    /// known: no deposit, withdrawal, eviction or other draw after that moves a seat. A point
    /// that hits a juror unable to sit now (node inactive, no penalty of its deposit free)
    /// moves on to the seat's next point. A beacon no longer readable (blockhash after 256
    /// blocks, prevrandao after PREVRANDAO_WINDOW) re-arms a seed block `drawDelayBlocks`
    /// ahead instead. Reverts while the pool is below `minPool` or a seat finds no juror in
    /// SEAT_TRIES points: the case waits, until the round ends without a jury (executeRuling).
    /// @param caseId The case.
    function draw(uint256 caseId) external nonReentrant {
        Case storage c = _inPhase(caseId, Phase.Drawing);
        Round[] storage rounds = _rounds[caseId];
        uint256 r = rounds.length - 1;
        Round storage round = rounds[r];
        uint256 seedBlock = round.seedBlock;
        if (block.number > round.drawBy) revert OutsideWindow(caseId, seedBlock + 1, round.drawBy);
        if (block.number <= seedBlock) revert NotYet(caseId, seedBlock + 1);
        uint256 window = source == Source.Blockhash ? 256 : PREVRANDAO_WINDOW;
        if (block.number > seedBlock + window) {
            round.seedBlock = uint64(block.number + drawDelayBlocks);
            emit DrawRearmed(caseId, r, round.seedBlock);
            return;
        }
        uint48 armedAt = uint48(seedBlock - drawDelayBlocks);
        (address[5] memory excluded, uint256 count, uint256 excludedWei) = _excluded(c.parties, armedAt);
        uint256 pool = _poolAt.upperLookupRecent(armedAt) - count;
        if (pool < minPool) revert PoolTooSmall(pool, minPool);
        uint256 eligible = _totalAt.upperLookupRecent(armedAt) - excludedWei;
        bytes32 beacon = source == Source.Blockhash ? blockhash(seedBlock) : bytes32(block.prevrandao);
        bytes32 seed = keccak256(abi.encode(beacon, c.challengerSalt, c.accusedSalt, caseId, r));
        uint256 penalty = penaltyWei();
        for (uint256 seat = 0; seat < round.size; ++seat) {
            address node = address(0);
            for (uint256 try_ = 0; node == address(0); ++try_) {
                if (try_ == SEAT_TRIES) revert JuryNotDrawable(caseId, seat);
                uint256 point = uint256(keccak256(abi.encode(seed, seat, try_))) % eligible;
                node = jurorAt[_findEligible(point, excluded, count, armedAt)];
                Juror storage hit = jurors[node];
                if (uint256(hit.depositWei) - hit.lockedWei < penalty || !registry.isActive(node)) {
                    node = address(0);
                }
            }
            jurors[node].lockedWei += uint96(penalty);
            votes[caseId][r][node].seats += 1;
            round.seats.push(node);
        }
        round.drawnAt = uint64(block.number);
        c.phase = Phase.Voting;
        emit JuryDrawn(caseId, r, round.seats);
    }

    /// @notice A drawn juror's sealed vote: keccak256(abi.encode(caseId, round, node, choice,
    /// salt)), by the node or its wallet, in the `phaseBlocks` after the draw.
    /// @param caseId The case.
    /// @param node The juror node.
    /// @param commitment The sealed vote.
    function commitVote(uint256 caseId, address node, bytes32 commitment) external {
        (uint256 r, Round storage round) = _votingRound(caseId);
        Vote storage vote = _ownVote(caseId, r, node);
        uint256 from = uint256(round.drawnAt) + 1;
        if (block.number < from || block.number > from - 1 + phaseBlocks) {
            revert OutsideWindow(caseId, from, from - 1 + phaseBlocks);
        }
        if (vote.commitment != bytes32(0)) revert AlreadyCommitted(caseId, node);
        vote.commitment = commitment;
        emit VoteCommitted(caseId, r, node);
    }

    /// @notice Opens a sealed vote in the `phaseBlocks` after the commit window: RIGHT (1) or
    /// WRONG (2), counted once per seat the juror holds.
    /// @param caseId The case.
    /// @param node The juror node.
    /// @param choice RIGHT or WRONG.
    /// @param salt The vote's salt.
    function revealVote(uint256 caseId, address node, uint256 choice, bytes32 salt) external {
        (uint256 r, Round storage round) = _votingRound(caseId);
        Vote storage vote = _ownVote(caseId, r, node);
        uint256 from = uint256(round.drawnAt) + phaseBlocks + 1;
        if (block.number < from || block.number > from - 1 + phaseBlocks) {
            revert OutsideWindow(caseId, from, from - 1 + phaseBlocks);
        }
        bool sealedSo = vote.commitment == voteCommitment(caseId, r, node, choice, salt);
        if (vote.choice != 0 || (choice != RIGHT && choice != WRONG) || !sealedSo) revert BadVote(caseId, node);
        vote.choice = uint8(choice);
        if (choice == RIGHT) round.votesRight += vote.seats;
        else round.votesWrong += vote.seats;
        emit VoteRevealed(caseId, r, node, choice);
    }

    /// @notice Funds the next, larger jury (7, 15, then 31) in the `phaseBlocks` after a
    /// round's votes are revealed; anyone may, once per round, with exactly its fees.
    /// @param caseId The case.
    function appeal(uint256 caseId) external payable nonReentrant {
        (uint256 r, Round storage round) = _votingRound(caseId);
        uint256 from = uint256(round.drawnAt) + 2 * phaseBlocks + 1;
        if (r == FINAL_ROUND) revert NoAppeal(caseId);
        if (block.number < from || block.number > from - 1 + phaseBlocks) {
            revert OutsideWindow(caseId, from, from - 1 + phaseBlocks);
        }
        uint256 fees = sizeOf(r + 1) * feeWei;
        if (msg.value != fees) revert WrongFee(msg.value, fees);
        Round storage next = _rounds[caseId].push();
        next.size = uint8(sizeOf(r + 1));
        next.feesWei = uint128(fees);
        next.funder = msg.sender;
        _armDraw(next);
        _cases[caseId].phase = Phase.Drawing;
        emit AppealFunded(caseId, r + 1, msg.sender, fees);
    }

    /// @notice Ends a case whose last window has passed and calls the arbitrable back. Anyone
    /// may call. The ruling: WRONG or RIGHT by the last drawn round's majority of revealed
    /// seats (a tie or no vote: RIGHT, the accuser carries the burden); RIGHT when the
    /// challenger never revealed its salt; REFUSED when the first round could not be drawn
    /// (an appeal that could not be drawn leaves the ruling before it, its fees refunded).
    /// Every seat is then settled: a revealed vote matching the ruling earns the fee, any other
    /// seat forfeits its penalty; both the penalty and the unpaid fee are burned.
    /// @param caseId The case.
    function executeRuling(uint256 caseId) external nonReentrant {
        Case storage c = _cases[caseId];
        Round[] storage rounds = _rounds[caseId];
        uint256 last = rounds.length == 0 ? 0 : rounds.length - 1;
        uint256 ruling;
        if (c.phase == Phase.Salts) {
            uint256 after_ = uint256(c.openedAt) + 2 * phaseBlocks;
            if (block.number <= after_) revert NotYet(caseId, after_ + 1);
            ruling = RIGHT; // the challenger's salt never came
            _refund(rounds[0]);
        } else if (c.phase == Phase.Drawing) {
            Round storage round = rounds[last];
            if (block.number <= round.drawBy) revert NotYet(caseId, uint256(round.drawBy) + 1);
            _refund(round);
            ruling = last == 0 ? REFUSED : _majority(rounds[last - 1]);
        } else if (c.phase == Phase.Voting) {
            Round storage round = rounds[last];
            uint256 windows = last == FINAL_ROUND ? 2 : 3;
            uint256 after_ = uint256(round.drawnAt) + windows * phaseBlocks;
            if (block.number <= after_) revert NotYet(caseId, after_ + 1);
            ruling = _majority(round);
        } else {
            revert WrongPhase(caseId, c.phase);
        }
        c.phase = Phase.Ruled;
        c.ruling = uint8(ruling);
        for (uint256 r = 0; r < rounds.length; ++r) {
            _settle(caseId, r, rounds[r], ruling);
        }
        emit CaseRuled(caseId, ruling);
        IArbitrable(c.arbitrable).rule(caseId, ruling);
    }

    /// @notice Sends the caller the fees and refunds credited to it.
    function withdrawCredit() external nonReentrant {
        uint256 amount = creditWei[msg.sender];
        if (amount == 0) revert NothingToWithdraw(msg.sender);
        creditWei[msg.sender] = 0;
        emit CreditWithdrawn(msg.sender, amount);
        _send(msg.sender, amount);
    }

    // ---------------------------------------------------------------- views

    /// @notice Seats of round `r`: 3, 7, 15, 31.
    function sizeOf(uint256 r) public pure returns (uint256) {
        return (4 << r) - 1;
    }

    /// @notice What an absent or incoherent seat forfeits, and the least deposit a juror draws with.
    function penaltyWei() public view returns (uint256) {
        return PENALTY_FEES * feeWei;
    }

    /// @notice The sealed vote a juror commits.
    function voteCommitment(uint256 caseId, uint256 r, address node, uint256 choice, bytes32 salt)
        public
        pure
        returns (bytes32)
    {
        return keccak256(abi.encode(caseId, r, node, choice, salt));
    }

    /// @notice A case: parties, arbitrable, opening block, phase, whether answered, ruling, salts.
    function getCase(uint256 caseId) external view returns (Case memory) {
        return _cases[caseId];
    }

    /// @notice The case's rounds, seats included.
    function getRounds(uint256 caseId) external view returns (Round[] memory) {
        return _rounds[caseId];
    }

    // ---------------------------------------------------------------- internals

    function _inPhase(uint256 caseId, Phase phase) private view returns (Case storage c) {
        c = _cases[caseId];
        if (c.phase != phase) revert WrongPhase(caseId, c.phase);
    }

    function _votingRound(uint256 caseId) private view returns (uint256 r, Round storage round) {
        _inPhase(caseId, Phase.Voting);
        Round[] storage rounds = _rounds[caseId];
        r = rounds.length - 1;
        round = rounds[r];
    }

    function _ownVote(uint256 caseId, uint256 r, address node) private view returns (Vote storage vote) {
        vote = votes[caseId][r][node];
        if (vote.seats == 0) revert NotJuror(caseId, node);
        if (msg.sender != node && msg.sender != jurors[node].wallet) revert NotNodeWallet(node, msg.sender);
    }

    function _armDraw(Round storage round) private {
        round.seedBlock = uint64(block.number + drawDelayBlocks);
        round.drawBy = uint64(block.number + drawDelayBlocks + DRAW_PATIENCE_PHASES * phaseBlocks);
    }

    function _majority(Round storage round) private view returns (uint256) {
        return round.votesWrong > round.votesRight ? WRONG : RIGHT;
    }

    function _refund(Round storage round) private {
        creditWei[round.funder] += round.feesWei;
        round.feesWei = 0;
    }

    /// @dev The jurors out of a case's draw (weight above 0 at block `armedAt` only): the accused
    /// node, the challenger, and the juror nodes of the accused's wallet, the challenger's and
    /// the sponsor's; with their weight at `armedAt`.
    function _excluded(Parties storage parties, uint48 armedAt)
        private
        view
        returns (address[5] memory found, uint256 count, uint256 weightWei)
    {
        address[5] memory candidates = [
            parties.accused,
            parties.challenger,
            jurorOf[parties.accusedWallet],
            jurorOf[parties.challenger],
            jurorOf[parties.sponsor]
        ];
        for (uint256 i = 0; i < 5; ++i) {
            address node = candidates[i];
            uint256 weight = node == address(0) ? 0 : _weightAt[node].upperLookupRecent(armedAt);
            if (weight == 0) continue;
            bool seen = false;
            for (uint256 j = 0; j < count; ++j) {
                seen = seen || found[j] == node;
            }
            if (!seen) {
                found[count++] = node;
                weightWei += weight;
            }
        }
    }

    /// @dev The slot at `point` of the eligible weights laid end to end, the excluded jurors'
    /// weights taken out: the smallest slot t with prefix(t) - excluded weight up to t > point.
    /// Each pass moves the point past the excluded weight before the slot found, so it settles
    /// within count + 1 passes, never on an excluded slot.
    function _findEligible(uint256 point, address[5] memory excluded, uint256 count, uint48 armedAt)
        private
        view
        returns (uint256 slot)
    {
        uint256 shifted = point;
        for (uint256 pass = 0; pass <= count; ++pass) {
            slot = _treeFind(shifted, armedAt);
            uint256 before = point;
            for (uint256 i = 0; i < count; ++i) {
                address node = excluded[i];
                if (jurors[node].slot <= slot) before += _weightAt[node].upperLookupRecent(armedAt);
            }
            if (before == shifted) return slot;
            shifted = before;
        }
    }

    /// @dev Pays or fines every seat of round `r` against the final ruling.
    function _settle(uint256 caseId, uint256 r, Round storage round, uint256 ruling) private {
        address[] storage seats = round.seats;
        uint256 penalty = penaltyWei();
        for (uint256 i = 0; i < seats.length; ++i) {
            address node = seats[i];
            Juror storage juror = jurors[node];
            juror.lockedWei -= uint96(penalty);
            bool coherent = votes[caseId][r][node].choice == ruling;
            if (coherent) {
                creditWei[juror.wallet] += feeWei;
            } else {
                juror.depositWei -= uint96(penalty);
                burnedWei += penalty + feeWei;
            }
            _reweigh(juror, node);
            emit JurorSettled(caseId, r, node, coherent, coherent ? feeWei : penalty);
        }
    }

    /// @dev Brings the juror's weight in the draw tree, the total and the pool count in line
    /// with its deposit and eviction, checkpointed at this block.
    function _reweigh(Juror storage juror, address node) private {
        uint256 deposited = juror.depositWei;
        uint256 weight = juror.evicted || deposited < penaltyWei() ? 0 : deposited;
        uint256 old = juror.weightWei;
        if (weight == old) return;
        juror.weightWei = uint96(weight);
        uint48 now_ = uint48(block.number);
        _weightAt[node].push(now_, uint208(weight));
        if (old == 0) poolSize += 1;
        else if (weight == 0) poolSize -= 1;
        _poolAt.push(now_, uint208(poolSize));
        totalWeightWei = totalWeightWei + weight - old;
        _totalAt.push(now_, uint208(totalWeightWei));
        for (uint256 i = juror.slot; i <= MAX_JURORS; i += i & (~i + 1)) {
            Checkpoints.Trace208 storage cell = _tree[i];
            _tree[i].push(now_, uint208(cell.latest() + weight - old));
        }
    }

    /// @dev The slot whose weight covers `point` of the weights at block `armedAt` laid end to end
    /// (point < total).
    function _treeFind(uint256 point, uint48 armedAt) private view returns (uint256) {
        uint256 position = 0;
        for (uint256 step = MAX_JURORS; step != 0; step >>= 1) {
            uint256 next = position + step;
            if (next <= MAX_JURORS) {
                uint256 value = _tree[next].upperLookupRecent(armedAt);
                if (value <= point) {
                    position = next;
                    point -= value;
                }
            }
        }
        return position + 1;
    }

    function _send(address to, uint256 amountWei) private {
        (bool ok,) = to.call{value: amountWei}("");
        if (!ok) revert TransferFailed(to, amountWei);
    }
}
