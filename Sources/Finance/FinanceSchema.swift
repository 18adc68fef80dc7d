import ServiceKit
import Storage

/// The finance database (`<data-dir>/finance.sqlite`). Amounts are integer cents, times Unix
/// milliseconds. A scope is a household id, or '' for the marketplace. Migrations are never edited
/// once shipped: changes are new entries at the end.
public enum FinanceSchema {
    static let fileName = "finance.sqlite"

    static let migrations: [Migration] =
        Migration.kit + [
            Migration(
                name: "finance.001-ledger",
                sql: """
                    -- Every recorded payment, charge, settlement and repayment. Immutable but for the
                    -- erasure of a description (description and salt set to NULL together).
                    CREATE TABLE ledger_transactions (
                        id TEXT PRIMARY KEY NOT NULL,       -- ULID made inside the write: sorts in commit order
                        scope TEXT NOT NULL,
                        seq INTEGER NOT NULL,               -- position in the scope's hash chain, 1..
                        kind INTEGER NOT NULL,              -- finance.v1.TransactionKind
                        currency TEXT NOT NULL,
                        total_cents INTEGER NOT NULL,
                        split_mode INTEGER NOT NULL,        -- finance.v1.SplitMode
                        created_by TEXT NOT NULL,           -- '' for settlements
                        task_id TEXT NOT NULL,              -- '' unless a settlement
                        created_at INTEGER NOT NULL,
                        description TEXT,                   -- NULL once its author was erased
                        description_salt BLOB,              -- NULL once erased
                        description_hash BLOB NOT NULL,     -- SHA-256(salt || description): what the chain holds
                        prev_hash BLOB NOT NULL,
                        entry_hash BLOB NOT NULL,
                        UNIQUE (scope, seq)
                    );
                    -- One settlement per task, ever.
                    CREATE UNIQUE INDEX ledger_transactions_task ON ledger_transactions(task_id) WHERE task_id != '';
                    CREATE INDEX ledger_transactions_creator ON ledger_transactions(created_by) WHERE created_by != '';

                    -- The debts of a transaction, in request order.
                    CREATE TABLE ledger_debts (
                        transaction_id TEXT NOT NULL REFERENCES ledger_transactions(id),
                        position INTEGER NOT NULL,
                        debtor TEXT NOT NULL,
                        creditor TEXT NOT NULL,
                        amount_cents INTEGER NOT NULL CHECK (amount_cents > 0),
                        PRIMARY KEY (transaction_id, position)
                    ) WITHOUT ROWID;

                    -- Running balance per pair (user_a < user_b) and currency: positive = b owes a.
                    -- Updated in the same transaction as the entries; reads never sum history.
                    CREATE TABLE pair_balances (
                        scope TEXT NOT NULL,
                        user_a TEXT NOT NULL,
                        user_b TEXT NOT NULL,
                        currency TEXT NOT NULL,
                        balance_cents INTEGER NOT NULL,
                        entries INTEGER NOT NULL,
                        last_transaction_at INTEGER NOT NULL,
                        PRIMARY KEY (scope, user_a, user_b, currency)
                    ) WITHOUT ROWID;
                    CREATE INDEX pair_balances_b ON pair_balances(scope, user_b);

                    -- The history of each pair: one row per transaction that moved its balance, with the
                    -- balance right after it (same sign convention as pair_balances).
                    CREATE TABLE pair_entries (
                        scope TEXT NOT NULL,
                        user_a TEXT NOT NULL,
                        user_b TEXT NOT NULL,
                        transaction_id TEXT NOT NULL REFERENCES ledger_transactions(id),
                        currency TEXT NOT NULL,
                        delta_cents INTEGER NOT NULL CHECK (delta_cents != 0),
                        balance_after_cents INTEGER NOT NULL,
                        PRIMARY KEY (scope, user_a, user_b, transaction_id)
                    ) WITHOUT ROWID;

                    -- The head of each scope's chain, and a household's currency (fixed by its first
                    -- transaction; '' for the marketplace, which keeps currencies apart).
                    CREATE TABLE ledger_heads (
                        scope TEXT PRIMARY KEY NOT NULL,
                        seq INTEGER NOT NULL,
                        head_hash BLOB NOT NULL,
                        currency TEXT NOT NULL
                    ) WITHOUT ROWID;

                    -- Users erased by accounts' UserDeleted (shown as "Deleted user").
                    CREATE TABLE erased_users (
                        user_id TEXT PRIMARY KEY NOT NULL,
                        erased_at INTEGER NOT NULL
                    ) WITHOUT ROWID;
                    """)
        ]
}

extension FinanceSchema: ServiceDatabase {
    /// finance's database as a whole: what the core opens and what `finance-service backup` and
    /// `restore` work on.
    public static let schema = DatabaseSchema(service: "finance", fileName: fileName, migrations: migrations)
}
