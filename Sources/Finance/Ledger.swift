import Contracts
import Foundation
import RPCCore
import Security
import ServiceKit
import Storage

/// The ledger's reads and writes, inside the caller's transaction (a handler's one `store.write`
/// or `store.read`). `append` is the only way money enters: it writes the transaction, its debts,
/// each pair's running balance and history row, and the scope's chain head, all in the same
/// transaction, so a balance can never disagree with its history.
enum Ledger {
    /// What a handler asks to record (the id, time, sequence and hashes are made inside the write).
    struct NewTransaction: Sendable {
        var scope: String
        var kind: Finance_V1_TransactionKind
        var currency: String
        var totalCents: Int64
        var splitMode: Finance_V1_SplitMode
        var createdBy: String
        var taskID: String
        var description: String
        var debts: [LedgerChain.Debt]
    }

    /// Shown instead of a description whose author was erased.
    static let erasedDescription = "(erased)"

    // MARK: Writing

    /// Records `new` and returns it as the contract shows it. Throws FAILED_PRECONDITION when a
    /// balance would overflow (nothing is written: the whole transaction rolls back).
    static func append(_ tx: Transaction, _ new: NewTransaction, clock: any WallClock) throws -> Finance_V1_Transaction {
        precondition(!new.debts.isEmpty)
        // Ids sort in commit order, across restarts too (a clock set back never sorts a new
        // transaction before an old one): history pages and balance_after rely on it.
        var id = ULID.make(now: clock.nowMilliseconds())
        if let last = try tx.queryOne("SELECT id FROM ledger_transactions ORDER BY id DESC LIMIT 1")?.get(0, as: String.self),
            id <= last
        {
            id = ULID.make(now: ulidMilliseconds(last) + 1)
        }
        let createdAt = ulidMilliseconds(id)

        let head = try tx.queryOne("SELECT seq, head_hash, currency FROM ledger_heads WHERE scope = ?", new.scope)
        let seq = (try head?.get("seq", as: Int64.self) ?? 0) + 1
        let previous = try head?.get("head_hash", as: [UInt8].self) ?? LedgerChain.genesis
        let salt = SecureRandom.bytes(16)
        let entry = LedgerChain.Entry(
            scope: new.scope, sequence: seq, transactionID: id, kind: new.kind.rawValue, currency: new.currency,
            totalCents: new.totalCents, splitMode: new.splitMode.rawValue, createdBy: new.createdBy, taskID: new.taskID,
            createdAt: createdAt, descriptionCommitment: LedgerChain.commitment(salt: salt, description: new.description),
            debts: new.debts)
        let hash = LedgerChain.hash(previous: previous, entry)
        try tx.execute(
            """
            INSERT INTO ledger_transactions (id, scope, seq, kind, currency, total_cents, split_mode, created_by, task_id,
                created_at, description, description_salt, description_hash, prev_hash, entry_hash)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """,
            id, new.scope, seq, Int64(new.kind.rawValue), new.currency, new.totalCents, Int64(new.splitMode.rawValue), new.createdBy,
            new.taskID, createdAt, new.description, salt, entry.descriptionCommitment, previous, hash)
        try tx.execute(
            "INSERT INTO ledger_heads (scope, seq, head_hash, currency) VALUES (?, ?, ?, ?) "
                + "ON CONFLICT (scope) DO UPDATE SET seq = excluded.seq, head_hash = excluded.head_hash",
            new.scope, seq, hash, new.scope.isEmpty ? "" : new.currency)

        for (position, d) in new.debts.enumerated() {
            try tx.execute(
                "INSERT INTO ledger_debts (transaction_id, position, debtor, creditor, amount_cents) VALUES (?, ?, ?, ?, ?)",
                id, Int64(position), d.debtor, d.creditor, d.cents)
            let (a, b) = d.debtor < d.creditor ? (d.debtor, d.creditor) : (d.creditor, d.debtor)
            let delta = d.debtor == b ? d.cents : -d.cents  // positive = b owes a
            let current = try tx.queryOne(
                "SELECT balance_cents FROM pair_balances WHERE scope = ? AND user_a = ? AND user_b = ? AND currency = ?",
                new.scope, a, b, new.currency)?.get(0, as: Int64.self)
            guard let after = MoneyRules.add(current ?? 0, delta) else {
                throw RPCError(.failedPrecondition, "this amount would overflow the balance between two users: nothing was recorded")
            }
            if current == nil {
                try tx.execute(
                    "INSERT INTO pair_balances (scope, user_a, user_b, currency, balance_cents, entries, last_transaction_at) VALUES (?, ?, ?, ?, ?, 1, ?)",
                    new.scope, a, b, new.currency, after, createdAt)
            } else {
                try tx.execute(
                    """
                    UPDATE pair_balances SET balance_cents = ?, entries = entries + 1, last_transaction_at = ?
                    WHERE scope = ? AND user_a = ? AND user_b = ? AND currency = ?
                    """, after, createdAt, new.scope, a, b, new.currency)
            }
            try tx.execute(
                "INSERT INTO pair_entries (scope, user_a, user_b, transaction_id, currency, delta_cents, balance_after_cents) VALUES (?, ?, ?, ?, ?, ?, ?)",
                new.scope, a, b, id, new.currency, delta, after)
        }
        return proto(id: id, new: new, createdAt: createdAt)
    }

    static func proto(id: String, new: NewTransaction, createdAt: Int64) -> Finance_V1_Transaction {
        var t = Finance_V1_Transaction()
        t.transactionId = id
        t.kind = new.kind
        t.householdId = new.scope
        t.description_p = new.description
        t.total = money(new.totalCents, new.currency)
        t.splitMode = new.splitMode
        t.debts = new.debts.map { d in
            var debt = Finance_V1_Debt()
            debt.debtorUserId = d.debtor
            debt.creditorUserId = d.creditor
            debt.amount = money(d.cents, new.currency)
            return debt
        }
        t.createdByUserId = new.createdBy
        t.taskId = new.taskID
        t.createdAt = Google_Protobuf_Timestamp(milliseconds: createdAt)
        return t
    }

    // MARK: Reading

    /// A household's currency (fixed by its first transaction); nil before it.
    static func currency(_ r: some SQLReader, scope: String) throws -> String? {
        try r.queryOne("SELECT currency FROM ledger_heads WHERE scope = ?", scope)?.get(0, as: String.self)
    }

    /// A recorded transaction, as the contract shows it.
    static func transaction(_ r: some SQLReader, id: String) throws -> Finance_V1_Transaction? {
        guard
            let row = try r.queryOne(
                "SELECT scope, kind, currency, total_cents, split_mode, created_by, task_id, created_at, description FROM ledger_transactions WHERE id = ?",
                id)
        else { return nil }
        let debts = try r.query("SELECT debtor, creditor, amount_cents FROM ledger_debts WHERE transaction_id = ? ORDER BY position", id)
            .map { LedgerChain.Debt(try $0.get(0), try $0.get(1), try $0.get(2)) }
        let new = NewTransaction(
            scope: try row.get("scope"), kind: Finance_V1_TransactionKind(rawValue: Int32(try row.get("kind", as: Int64.self))),
            currency: try row.get("currency"), totalCents: try row.get("total_cents"),
            splitMode: Finance_V1_SplitMode(rawValue: Int32(try row.get("split_mode", as: Int64.self))),
            createdBy: try row.get("created_by"), taskID: try row.get("task_id"),
            description: try row.get("description", as: String?.self) ?? erasedDescription, debts: debts)
        return proto(id: id, new: new, createdAt: try row.get("created_at"))
    }

    /// One of the caller's balances.
    struct PairBalance: Sendable {
        var counterpart: String
        var currency: String
        /// Positive = the counterpart owes the caller.
        var cents: Int64
        var lastTransactionAt: Int64
    }

    /// Every balance row of `user` in `scope` (one per counterpart and currency); cost grows with
    /// the counterparts, never with the history.
    static func balances(_ r: some SQLReader, scope: String, user: String) throws -> [PairBalance] {
        let asA = try r.query(
            "SELECT user_b, currency, balance_cents, last_transaction_at FROM pair_balances WHERE scope = ? AND user_a = ?", scope, user)
        let asB = try r.query(
            "SELECT user_a, currency, balance_cents, last_transaction_at FROM pair_balances WHERE scope = ? AND user_b = ?", scope, user)
        return try asA.map {
            PairBalance(counterpart: try $0.get(0), currency: try $0.get(1), cents: try $0.get(2), lastTransactionAt: try $0.get(3))
        }
            + asB.map {
                PairBalance(
                    counterpart: try $0.get(0), currency: try $0.get(1), cents: -(try $0.get(2, as: Int64.self)), lastTransactionAt: try $0.get(3))
            }
    }

    /// Every pair balance of a scope in one currency: (a, b, cents; positive = b owes a).
    static func pairs(_ r: some SQLReader, scope: String, currency: String) throws -> [(a: String, b: String, cents: Int64)] {
        try r.query(
            "SELECT user_a, user_b, balance_cents FROM pair_balances WHERE scope = ? AND currency = ? AND balance_cents != 0",
            scope, currency
        )
        .map { (try $0.get(0), try $0.get(1), try $0.get(2)) }
    }

    /// The history of `user` with `counterpart`, newest first, after the cursor `before` (a
    /// transaction id), at most `limit`.
    static func history(
        _ r: some SQLReader, scope: String, user: String, counterpart: String, before: String?,
        limit: Int
    ) throws -> [Finance_V1_TransactionEntry] {
        let (a, b) = user < counterpart ? (user, counterpart) : (counterpart, user)
        let sign: Int64 = user == a ? 1 : -1
        let rows = try r.query(
            """
            SELECT e.transaction_id, e.currency, e.delta_cents, e.balance_after_cents, t.kind, t.description, t.total_cents,
                   t.created_by, t.task_id, t.created_at
            FROM pair_entries e JOIN ledger_transactions t ON t.id = e.transaction_id
            WHERE e.scope = ? AND e.user_a = ? AND e.user_b = ? AND e.transaction_id < ?
            ORDER BY e.transaction_id DESC LIMIT ?
            """, scope, a, b, before ?? "\u{10FFFF}", Int64(limit))
        return try rows.map { row in
            var e = Finance_V1_TransactionEntry()
            let currency: String = try row.get("currency")
            e.transactionId = try row.get("transaction_id")
            e.kind = Finance_V1_TransactionKind(rawValue: Int32(try row.get("kind", as: Int64.self)))
            e.description_p = try row.get("description", as: String?.self) ?? erasedDescription
            e.amount = money(sign * (try row.get("delta_cents", as: Int64.self)), currency)
            e.transactionTotal = money(try row.get("total_cents"), currency)
            e.balanceAfter = money(sign * (try row.get("balance_after_cents", as: Int64.self)), currency)
            e.createdByUserId = try row.get("created_by")
            e.taskId = try row.get("task_id")
            e.createdAt = Google_Protobuf_Timestamp(milliseconds: try row.get("created_at"))
            return e
        }
    }

    // MARK: Verification

    /// Verifies `scope`'s chain (every entry, every kept description), its head, and every pair
    /// balance and history row against the debts: the first entry that does not match, or a
    /// balance that disagrees.
    static func verify(_ r: some SQLReader, scope: String) throws -> Finance_V1_VerifyLedgerResponse {
        let rows = try r.query(
            """
            SELECT id, seq, kind, currency, total_cents, split_mode, created_by, task_id, created_at, description,
                   description_salt, description_hash, prev_hash, entry_hash
            FROM ledger_transactions WHERE scope = ? ORDER BY seq
            """, scope)
        var debtsByID: [String: [LedgerChain.Debt]] = [:]
        for d in try r.query(
            """
            SELECT d.transaction_id, d.debtor, d.creditor, d.amount_cents FROM ledger_debts d
            JOIN ledger_transactions t ON t.id = d.transaction_id WHERE t.scope = ? ORDER BY d.transaction_id, d.position
            """, scope)
        {
            debtsByID[try d.get(0), default: []].append(LedgerChain.Debt(try d.get(1), try d.get(2), try d.get(3)))
        }
        var stored: [LedgerChain.Stored] = []
        stored.reserveCapacity(rows.count)
        for row in rows {
            let id: String = try row.get("id")
            let entry = LedgerChain.Entry(
                scope: scope, sequence: try row.get("seq"), transactionID: id, kind: Int32(try row.get("kind", as: Int64.self)),
                currency: try row.get("currency"), totalCents: try row.get("total_cents"),
                splitMode: Int32(try row.get("split_mode", as: Int64.self)), createdBy: try row.get("created_by"),
                taskID: try row.get("task_id"), createdAt: try row.get("created_at"),
                descriptionCommitment: try row.get("description_hash"), debts: debtsByID[id] ?? [])
            stored.append(
                LedgerChain.Stored(
                    entry: entry, previousHash: try row.get("prev_hash"), entryHash: try row.get("entry_hash"),
                    description: try row.get("description"), salt: try row.get("description_salt")))
        }
        let verdict = LedgerChain.verify(stored)
        var response = Finance_V1_VerifyLedgerResponse()
        response.entriesChecked = verdict.checked
        if let bad = verdict.firstBad {
            response.firstBadTransactionId = bad.transactionID
            response.firstBadSequence = bad.sequence
            response.problem = bad.problem
            return response
        }
        let head = try r.queryOne("SELECT seq, head_hash FROM ledger_heads WHERE scope = ?", scope)
        if let head {
            guard try head.get("seq", as: Int64.self) == Int64(stored.count), try head.get("head_hash", as: [UInt8].self) == verdict.head else {
                response.problem = "the chain head does not match its last entry (entries were removed after it)"
                return response
            }
        } else if !stored.isEmpty {
            response.problem = "entries exist but the chain has no head"
            return response
        }
        // Balances and history rows, recomputed from the debts in chain order.
        var running: [PairKey: Int64] = [:]
        var expected: [String: [PairKey: Int64]] = [:]  // transaction → pair → (delta)
        var expectedAfter: [String: [PairKey: Int64]] = [:]
        for s in stored {
            for d in s.entry.debts {
                let (a, b) = d.debtor < d.creditor ? (d.debtor, d.creditor) : (d.creditor, d.debtor)
                let key = PairKey(a: a, b: b, currency: s.entry.currency)
                let delta = d.debtor == b ? d.cents : -d.cents
                running[key, default: 0] &+= delta
                expected[s.entry.transactionID, default: [:]][key, default: 0] &+= delta
                expectedAfter[s.entry.transactionID, default: [:]][key] = running[key]!
            }
        }
        var found = 0
        for row in try r.query(
            "SELECT transaction_id, user_a, user_b, currency, delta_cents, balance_after_cents FROM pair_entries WHERE scope = ?", scope)
        {
            let id: String = try row.get(0)
            let key = PairKey(a: try row.get(1), b: try row.get(2), currency: try row.get(3))
            found += 1
            guard expected[id]?[key] == (try row.get(4, as: Int64.self)), expectedAfter[id]?[key] == (try row.get(5, as: Int64.self)) else {
                response.firstBadTransactionId = id
                response.firstBadSequence = stored.first { $0.entry.transactionID == id }?.entry.sequence ?? 0
                response.problem = "the history row of \(key.a) and \(key.b) does not match the transaction's debts"
                return response
            }
        }
        if found != expected.values.reduce(0, { $0 + $1.count }) {
            response.problem = "history rows are missing for some transactions"
            return response
        }
        var balanceRows = 0
        for row in try r.query("SELECT user_a, user_b, currency, balance_cents FROM pair_balances WHERE scope = ?", scope) {
            let key = PairKey(a: try row.get(0), b: try row.get(1), currency: try row.get(2))
            balanceRows += 1
            guard running[key] == (try row.get(3, as: Int64.self)) else {
                response.problem = "the balance of \(key.a) and \(key.b) (\(key.currency)) is not the sum of their history"
                return response
            }
        }
        if balanceRows != running.count {
            response.problem = "some pairs with history have no balance row"
            return response
        }
        response.verified = true
        response.headHash = verdict.head.map(LedgerChain.hex) ?? ""
        return response
    }

    struct PairKey: Hashable {
        var a: String
        var b: String
        var currency: String
    }

    /// Every scope with entries (operator verification of everything).
    static func scopes(_ r: some SQLReader) throws -> [String] {
        try r.query("SELECT scope FROM ledger_heads ORDER BY scope").map { try $0.get(0) }
    }

    // MARK: Helpers

    static func money(_ cents: Int64, _ currency: String) -> Common_V1_Money {
        var m = Common_V1_Money()
        m.amountCents = cents
        m.currency = currency
        return m
    }

    /// The Unix milliseconds of a ULID (its first 10 characters).
    static func ulidMilliseconds(_ id: String) -> Int64 {
        let alphabet = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ".utf8)
        var v: Int64 = 0
        for c in id.utf8.prefix(10) { v = v << 5 | Int64(alphabet.firstIndex(of: c) ?? 0) }
        return v
    }
}
