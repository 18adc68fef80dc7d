import ServiceKit
import Storage

/// matchmaking's database: the kit's tables, then its own. Times are Unix milliseconds; enums are
/// the contract's numbers; boards, moves, outcomes and events are stored as their protobuf bytes
/// (they are only ever read whole).
public enum MatchmakingSchema {
    public static let fileName = "matchmaking.sqlite"

    public static let migrations: [Migration] =
        Migration.kit + [
            Migration(
                name: "001-matchmaking",
                sql: """
                    -- Public names of the users met (from accounts), so answers need no call.
                    CREATE TABLE users (
                        id TEXT PRIMARY KEY NOT NULL,
                        username TEXT NOT NULL,
                        display_name TEXT NOT NULL,
                        refreshed_at INTEGER NOT NULL
                    ) WITHOUT ROWID;
                    -- Erased accounts (EraseUser): never cached or rated again.
                    CREATE TABLE erased_users (id TEXT PRIMARY KEY NOT NULL, erased_at INTEGER NOT NULL) WITHOUT ROWID;

                    CREATE TABLE matches (
                        id TEXT PRIMARY KEY NOT NULL,
                        kind INTEGER NOT NULL,
                        status INTEGER NOT NULL,              -- 1 ACTIVE, 2 FINISHED
                        rated INTEGER NOT NULL,
                        first_id TEXT NOT NULL,               -- '' once the player's account was erased
                        second_id TEXT NOT NULL,
                        first_rating_before REAL NOT NULL,
                        second_rating_before REAL NOT NULL,
                        seed INTEGER NOT NULL,                -- the dealt-shape sequence
                        board BLOB NOT NULL,                  -- matchmaking.v1.Board
                        turn_number INTEGER NOT NULL,         -- next turn to play
                        turn_started_at INTEGER NOT NULL,
                        turn_deadline INTEGER,                -- NULL: none (local, finished)
                        outcome BLOB,                         -- matchmaking.v1.MatchOutcome once finished
                        rematch_state INTEGER NOT NULL DEFAULT 0,
                        first_rematch INTEGER NOT NULL DEFAULT 0,
                        second_rematch INTEGER NOT NULL DEFAULT 0,
                        rematch_of TEXT NOT NULL DEFAULT '',
                        rematch_id TEXT NOT NULL DEFAULT '',
                        window_closes_at INTEGER,             -- rematch window still open until then
                        started_at INTEGER NOT NULL,
                        finished_at INTEGER,
                        last_sequence INTEGER NOT NULL DEFAULT 0
                    ) WITHOUT ROWID;
                    CREATE INDEX matches_first ON matches(first_id, status, id);
                    CREATE INDEX matches_second ON matches(second_id, status, id);
                    CREATE INDEX matches_deadline ON matches(turn_deadline) WHERE turn_deadline IS NOT NULL;
                    CREATE INDEX matches_window ON matches(window_closes_at) WHERE window_closes_at IS NOT NULL;

                    -- Every move of every match (matchmaking.v1.Move without the player, who is the seat's).
                    CREATE TABLE match_moves (
                        match_id TEXT NOT NULL,
                        turn_number INTEGER NOT NULL,
                        move BLOB NOT NULL,
                        PRIMARY KEY (match_id, turn_number)
                    ) WITHOUT ROWID;

                    -- The live events of each match (matchmaking.v1.WatchMatchResponse), by sequence.
                    CREATE TABLE match_events (
                        match_id TEXT NOT NULL,
                        sequence INTEGER NOT NULL,
                        event BLOB NOT NULL,
                        PRIMARY KEY (match_id, sequence)
                    ) WITHOUT ROWID;

                    CREATE TABLE chat_messages (
                        id TEXT PRIMARY KEY NOT NULL,
                        match_id TEXT NOT NULL,
                        seat INTEGER NOT NULL,
                        sender_id TEXT NOT NULL,
                        text TEXT NOT NULL,
                        sent_at INTEGER NOT NULL
                    ) WITHOUT ROWID;
                    CREATE INDEX chat_by_match ON chat_messages(match_id, id);
                    CREATE INDEX chat_by_sender ON chat_messages(sender_id);

                    CREATE TABLE challenges (
                        id TEXT PRIMARY KEY NOT NULL,
                        challenger_id TEXT NOT NULL,
                        challenged_id TEXT NOT NULL,
                        pair_low TEXT NOT NULL,               -- min(challenger, challenged)
                        pair_high TEXT NOT NULL,
                        status INTEGER NOT NULL,              -- ChallengeStatus; PENDING past expires_at reads EXPIRED
                        rated INTEGER NOT NULL,
                        message TEXT NOT NULL,
                        created_at INTEGER NOT NULL,
                        expires_at INTEGER NOT NULL,
                        match_id TEXT NOT NULL DEFAULT ''
                    ) WITHOUT ROWID;
                    -- One pending challenge per pair, either direction.
                    CREATE UNIQUE INDEX challenges_pending_pair ON challenges(pair_low, pair_high) WHERE status = 1;
                    CREATE INDEX challenges_by_challenger ON challenges(challenger_id, id);
                    CREATE INDEX challenges_by_challenged ON challenges(challenged_id, id);
                    CREATE INDEX challenges_expiry ON challenges(expires_at) WHERE status = 1;

                    -- Glicko-2 ratings of players with at least one rated match. `version` grows with
                    -- every change (the in-memory leaderboard index applies updates in version order).
                    CREATE TABLE ratings (
                        user_id TEXT PRIMARY KEY NOT NULL,
                        rating REAL NOT NULL,
                        deviation REAL NOT NULL,
                        volatility REAL NOT NULL,
                        rated_matches INTEGER NOT NULL,
                        updated_at INTEGER NOT NULL,
                        version INTEGER NOT NULL
                    ) WITHOUT ROWID;

                    -- Aggregates of finished non-local matches.
                    CREATE TABLE stats (
                        user_id TEXT PRIMARY KEY NOT NULL,
                        matches_played INTEGER NOT NULL DEFAULT 0,
                        wins INTEGER NOT NULL DEFAULT 0,
                        losses INTEGER NOT NULL DEFAULT 0,
                        draws INTEGER NOT NULL DEFAULT 0,
                        moves_played INTEGER NOT NULL DEFAULT 0,
                        steps_played INTEGER NOT NULL DEFAULT 0,
                        wins_by_goal INTEGER NOT NULL DEFAULT 0,
                        quits INTEGER NOT NULL DEFAULT 0,
                        current_streak INTEGER NOT NULL DEFAULT 0,
                        best_streak INTEGER NOT NULL DEFAULT 0,
                        last_played_at INTEGER
                    ) WITHOUT ROWID;
                    """),
            Migration(
                name: "002-matches-finished",
                sql: """
                    -- The hourly purge of finished matches' event logs (MatchStore.purgeEventLogs)
                    -- reads a range of finished_at instead of scanning every match.
                    CREATE INDEX matches_finished ON matches(finished_at) WHERE status = 2;
                    """),
        ]
}

extension MatchmakingSchema: ServiceDatabase {
    /// matchmaking's database as a whole: what the core opens and what `matchmaking-service backup` and
    /// `restore` work on.
    public static let schema = DatabaseSchema(service: "matchmaking", fileName: fileName, migrations: migrations)
}
