import ServiceKit
import Storage

/// The tasks database (`<data-dir>/tasks.sqlite`): one file for every area of the service, each
/// area's tables in migrations named after it (`team-tasks.…`, `chores.…`, `marketplace.…`,
/// `habits.…`, each area's own in its store). Times are Unix milliseconds, dates `yyyymmdd` integers in the chore's zone.
/// Migrations are never edited once shipped: changes are new entries at the end.
public enum TasksSchema {
    static let fileName = "tasks.sqlite"

    static let migrations: [Migration] =
        Migration.kit + [
            Journal.migration,
            Migration(
                name: "tasks.001-users",
                sql: """
                    -- Names of the users the tasks show (from accounts; refreshed when stale). Erased
                    -- users are removed: their references show as "deleted-user".
                    CREATE TABLE users (
                        user_id TEXT PRIMARY KEY NOT NULL,
                        username TEXT NOT NULL,
                        display_name TEXT NOT NULL DEFAULT '',
                        refreshed_at INTEGER NOT NULL
                    ) WITHOUT ROWID;
                    """),
            Migration(
                name: "team-tasks.001-tables",
                sql: """
                    CREATE TABLE team_tasks (
                        id TEXT PRIMARY KEY NOT NULL,
                        name TEXT NOT NULL,
                        description TEXT NOT NULL,
                        creator_id TEXT,                    -- NULL once the creator was erased
                        team_id TEXT NOT NULL DEFAULT '',
                        created_at INTEGER NOT NULL,
                        completed_at INTEGER,               -- set while every participant completed
                        scored INTEGER NOT NULL DEFAULT 0,  -- RecordTeamTaskCompleted queued (once, ever)
                        comment_count INTEGER NOT NULL DEFAULT 0,
                        link_token TEXT UNIQUE              -- the public link while it exists
                    );
                    CREATE TABLE team_task_participants (
                        task_id TEXT NOT NULL REFERENCES team_tasks(id) ON DELETE CASCADE,
                        user_id TEXT NOT NULL,
                        position INTEGER NOT NULL,          -- order added (creator 0)
                        completed_at INTEGER,
                        PRIMARY KEY (task_id, user_id)
                    ) WITHOUT ROWID;
                    -- "My tasks", newest first, per section.
                    CREATE INDEX team_task_participants_user ON team_task_participants(user_id, task_id);
                    CREATE TABLE team_task_comments (
                        id TEXT PRIMARY KEY NOT NULL,
                        task_id TEXT NOT NULL REFERENCES team_tasks(id) ON DELETE CASCADE,
                        author_id TEXT,                     -- NULL once the author was erased
                        text TEXT NOT NULL,
                        created_at INTEGER NOT NULL
                    );
                    CREATE INDEX team_task_comments_task ON team_task_comments(task_id, id);
                    CREATE INDEX team_task_comments_author ON team_task_comments(author_id) WHERE author_id IS NOT NULL;
                    -- Attachment bytes, stored once per content (SHA-256), whatever tasks they are on.
                    CREATE TABLE attachment_blobs (
                        sha256 TEXT PRIMARY KEY NOT NULL,
                        size_bytes INTEGER NOT NULL,
                        data BLOB NOT NULL
                    );
                    CREATE TABLE team_task_attachments (
                        id TEXT PRIMARY KEY NOT NULL,
                        task_id TEXT NOT NULL REFERENCES team_tasks(id) ON DELETE CASCADE,
                        filename TEXT NOT NULL,
                        content_type TEXT NOT NULL,
                        size_bytes INTEGER NOT NULL,
                        sha256 TEXT NOT NULL REFERENCES attachment_blobs(sha256),
                        uploaded_by TEXT,                   -- whose upload token; NULL once erased
                        uploaded_at INTEGER NOT NULL
                    );
                    CREATE INDEX team_task_attachments_task ON team_task_attachments(task_id, id);
                    CREATE INDEX team_task_attachments_blob ON team_task_attachments(sha256);
                    -- Upload tokens, by SHA-256 of their normalised form (never stored in clear).
                    CREATE TABLE team_task_upload_tokens (
                        token_hash BLOB PRIMARY KEY NOT NULL,
                        task_id TEXT NOT NULL REFERENCES team_tasks(id) ON DELETE CASCADE,
                        created_by TEXT NOT NULL,
                        created_at INTEGER NOT NULL,
                        expires_at INTEGER NOT NULL
                    ) WITHOUT ROWID;
                    CREATE INDEX team_task_upload_tokens_user ON team_task_upload_tokens(created_by);
                    CREATE INDEX team_task_upload_tokens_expiry ON team_task_upload_tokens(expires_at);
                    """),
            Migration(
                name: "chores.001-tables",
                sql: """
                    CREATE TABLE chores (
                        id TEXT PRIMARY KEY NOT NULL,
                        household_id TEXT NOT NULL,
                        name TEXT NOT NULL,
                        description TEXT NOT NULL,
                        time_zone TEXT NOT NULL,
                        recurrence INTEGER NOT NULL,        -- 1 one-time, 2 every N days, 3 weekly, 4 monthly, 5 on demand
                        every_days INTEGER NOT NULL DEFAULT 0,
                        weekdays INTEGER NOT NULL DEFAULT 0, -- weekly: bit (d - 1) for ISO weekday d; 0 = every 7 days
                        anchor_day INTEGER NOT NULL DEFAULT 0, -- monthly: the day of month of the first due date
                        status INTEGER NOT NULL,            -- tasks.v1.ChoreStatus
                        due_day INTEGER,                    -- yyyymmdd; NULL while WAITING
                        current_index INTEGER NOT NULL,
                        current_user_id TEXT NOT NULL,      -- assignees[current_index], for the "assigned to" lists
                        revision INTEGER NOT NULL,
                        created_by TEXT,                    -- NULL once erased
                        created_at INTEGER NOT NULL,
                        last_finished_by TEXT,
                        last_finished_at INTEGER,
                        last_reminded_at INTEGER
                    );
                    CREATE INDEX chores_feed ON chores(household_id, status, due_day, name, id);
                    CREATE INDEX chores_assigned ON chores(household_id, current_user_id, status, due_day);
                    CREATE TABLE chore_assignees (
                        chore_id TEXT NOT NULL REFERENCES chores(id) ON DELETE CASCADE,
                        position INTEGER NOT NULL,
                        user_id TEXT NOT NULL,
                        PRIMARY KEY (chore_id, position)
                    ) WITHOUT ROWID;
                    CREATE INDEX chore_assignees_user ON chore_assignees(user_id);
                    """),
            MarketStore.migration,
            HabitStore.migration,
            Migration(
                name: "chores.002-finish-revision",
                sql: """
                    -- The revision a finish produced: a finish without expected_revision within a
                    -- minute of the last one is the same turn only if nothing happened since.
                    ALTER TABLE chores ADD COLUMN last_finished_revision INTEGER;
                    """),
            Migration(
                name: "marketplace.002-declined-bids",
                sql: """
                    -- Providers whose bid on a task the requester declined: they may not bid on that
                    -- task again (a declined hostile bidder cannot come straight back). Gone with the
                    -- task (cascade) or with the provider's account (EraseUser).
                    CREATE TABLE market_declined_bidders (
                        task_id TEXT NOT NULL REFERENCES market_tasks(id) ON DELETE CASCADE,
                        provider_id TEXT NOT NULL,
                        declined_at INTEGER NOT NULL,
                        PRIMARY KEY (task_id, provider_id)
                    ) WITHOUT ROWID;
                    CREATE INDEX market_declined_bidders_provider ON market_declined_bidders(provider_id);
                    """),
            Migration(
                name: "habits.002-event-zone",
                sql: """
                    -- The IANA zone an event was added in: the next event reads that zone's clock at its
                    -- own instant (daylight saving included), so staying in one zone never excuses a
                    -- day. NULL for events added before: their utc_offset alone is known.
                    ALTER TABLE habit_events ADD COLUMN time_zone TEXT;
                    """),
            MarketStore.foldedText,
            HabitStore.foldedComment,
            ReminderStore.migration,
        ]
}

extension TasksSchema: ServiceDatabase {
    /// tasks's database as a whole: what the core opens and what `tasks-service backup` and
    /// `restore` work on.
    public static let schema = DatabaseSchema(service: "tasks", fileName: fileName, migrations: migrations)
}
