import ServiceKit
import Storage

/// The social database (`<data-dir>/social.sqlite`). Times are Unix milliseconds. Users are named
/// by accounts' ids; `users` is a cache of their public fields (usernames never change, display
/// names are refreshed whenever social asks accounts). Migrations are never edited once shipped:
/// changes are new entries at the end.
public enum SocialSchema {
    static let fileName = "social.sqlite"

    static let migrations: [Migration] =
        Migration.kit + [
            Migration(
                name: "social.001-tables",
                sql: """
                    -- Public fields of the users social has met (from accounts), for lists and ordering.
                    CREATE TABLE users (
                        id TEXT PRIMARY KEY NOT NULL,
                        username TEXT NOT NULL,
                        username_key TEXT NOT NULL,       -- lower(username): ListFriends order
                        display_name TEXT NOT NULL DEFAULT '',
                        refreshed_at INTEGER NOT NULL
                    );
                    -- Users erased (EraseUser): skipped as recipients, never cached again.
                    CREATE TABLE erased_users (
                        id TEXT PRIMARY KEY NOT NULL,
                        erased_at INTEGER NOT NULL
                    );

                    -- Teams (seed A). A user is in at most one team: team_members.user_id is the key.
                    CREATE TABLE teams (
                        id TEXT PRIMARY KEY NOT NULL,
                        name TEXT NOT NULL,
                        score INTEGER NOT NULL DEFAULT 0,
                        score_reached_at INTEGER NOT NULL, -- when the team reached its current score (ties)
                        created_by TEXT NOT NULL,
                        created_at INTEGER NOT NULL
                    );
                    CREATE INDEX teams_ranking ON teams(score DESC, score_reached_at, id);
                    CREATE TABLE team_members (
                        user_id TEXT PRIMARY KEY NOT NULL,
                        team_id TEXT NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
                        position INTEGER NOT NULL,         -- creator 0, then in the order added
                        joined_at INTEGER NOT NULL
                    );
                    CREATE INDEX team_members_team ON team_members(team_id, position);
                    -- One row per (team, task): a task counts once per team.
                    CREATE TABLE team_task_completions (
                        team_id TEXT NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
                        task_id TEXT NOT NULL,
                        points INTEGER NOT NULL,
                        event_id TEXT NOT NULL,
                        recorded_at INTEGER NOT NULL,
                        PRIMARY KEY (team_id, task_id)
                    ) WITHOUT ROWID;

                    -- Households (seed B). A deleted household keeps its rows (finance reads its
                    -- memberships as at deletion); left_at marks former members.
                    CREATE TABLE households (
                        id TEXT PRIMARY KEY NOT NULL,
                        name TEXT NOT NULL,
                        created_by TEXT NOT NULL,
                        created_at INTEGER NOT NULL,
                        deleted_at INTEGER,
                        next_join_seq INTEGER NOT NULL DEFAULT 1
                    );
                    CREATE TABLE household_members (
                        household_id TEXT NOT NULL REFERENCES households(id),
                        user_id TEXT NOT NULL,
                        join_seq INTEGER NOT NULL,         -- join order (a rejoin goes to the end)
                        joined_at INTEGER NOT NULL,
                        left_at INTEGER,
                        PRIMARY KEY (household_id, user_id)
                    ) WITHOUT ROWID;
                    CREATE INDEX household_members_order ON household_members(household_id, join_seq);
                    CREATE INDEX household_members_user ON household_members(user_id, joined_at) WHERE left_at IS NULL;
                    -- Invite codes: 8 Crockford base32 characters, stored normalised (no hyphen, upper case).
                    CREATE TABLE household_invites (
                        code TEXT PRIMARY KEY NOT NULL,
                        household_id TEXT NOT NULL REFERENCES households(id),
                        email TEXT NOT NULL,
                        email_key TEXT NOT NULL,
                        invited_by TEXT NOT NULL,
                        created_at INTEGER NOT NULL,
                        expires_at INTEGER NOT NULL,
                        used_at INTEGER,
                        used_by TEXT,
                        revoked_at INTEGER
                    ) WITHOUT ROWID;
                    CREATE INDEX household_invites_household ON household_invites(household_id, created_at);

                    -- Friends (seed E): both directions stored, so a friend list is one index range.
                    CREATE TABLE friendships (
                        user_id TEXT NOT NULL,
                        friend_id TEXT NOT NULL,
                        since INTEGER NOT NULL,
                        PRIMARY KEY (user_id, friend_id)
                    ) WITHOUT ROWID;
                    CREATE TABLE blocks (
                        blocker_id TEXT NOT NULL,
                        blocked_id TEXT NOT NULL,
                        created_at INTEGER NOT NULL,
                        PRIMARY KEY (blocker_id, blocked_id)
                    ) WITHOUT ROWID;
                    CREATE INDEX blocks_recent ON blocks(blocker_id, created_at, blocked_id);
                    CREATE INDEX blocks_blocked ON blocks(blocked_id);

                    -- Follows (seed C).
                    CREATE TABLE follows (
                        follower_id TEXT NOT NULL,
                        followed_id TEXT NOT NULL,
                        since INTEGER NOT NULL,
                        PRIMARY KEY (follower_id, followed_id)
                    ) WITHOUT ROWID;
                    CREATE INDEX follows_following ON follows(follower_id, since, followed_id);
                    CREATE INDEX follows_followers ON follows(followed_id, since, follower_id);
                    CREATE TABLE follow_requests (
                        requester_id TEXT NOT NULL,
                        target_id TEXT NOT NULL,
                        created_at INTEGER NOT NULL,
                        PRIMARY KEY (requester_id, target_id)
                    ) WITHOUT ROWID;
                    CREATE INDEX follow_requests_outgoing ON follow_requests(requester_id, created_at, target_id);
                    CREATE INDEX follow_requests_incoming ON follow_requests(target_id, created_at, requester_id);

                    -- The inbox. Ids are ULIDs made inside the write transaction (the single writer),
                    -- so id order is commit order per recipient.
                    CREATE TABLE notifications (
                        id TEXT PRIMARY KEY NOT NULL,
                        recipient_id TEXT NOT NULL,
                        kind INTEGER NOT NULL,
                        title TEXT NOT NULL,
                        body TEXT NOT NULL,
                        actor_id TEXT,                     -- NULL: system, or the actor was erased
                        actor_username TEXT,
                        actor_display_name TEXT,
                        target BLOB,                       -- social.v1.NotificationTarget bytes
                        data BLOB,                         -- the data map (as a Notification's bytes)
                        created_at INTEGER NOT NULL,
                        read_at INTEGER,
                        silenced INTEGER NOT NULL,
                        event_id TEXT                      -- SendNotification's event (replays)
                    ) WITHOUT ROWID;
                    CREATE INDEX notifications_inbox ON notifications(recipient_id, id);
                    CREATE INDEX notifications_unread ON notifications(recipient_id, id) WHERE read_at IS NULL;
                    CREATE INDEX notifications_event ON notifications(event_id) WHERE event_id IS NOT NULL;
                    CREATE INDEX notifications_actor ON notifications(actor_id) WHERE actor_id IS NOT NULL;

                    CREATE TABLE notification_settings (
                        user_id TEXT PRIMARY KEY NOT NULL,
                        help_muted INTEGER NOT NULL DEFAULT 0,
                        snoozed_until INTEGER              -- NULL or past: not snoozed
                    );
                    """),
            Migration(
                name: "social.002-invite-mail-quotas",
                sql: """
                    -- Invite mails per sender and per address within a day (Households.checkMailQuota).
                    CREATE INDEX household_invites_inviter ON household_invites(invited_by, created_at);
                    CREATE INDEX household_invites_address ON household_invites(email_key, created_at);
                    """),
            Migration(
                name: "social.003-push-targets",
                sql: """
                    -- Push targets (issue 36): where a user's pushes go while the app is closed.
                    -- token_key is the kind and the APNs device token, FCM registration token or Web
                    -- Push endpoint, normalised (PushTargetRules): unique across users, so a token
                    -- another user registers moves to them (RegisterPushTarget deletes the old row
                    -- in the same transaction). The kind's own columns are NULL for other kinds.
                    CREATE TABLE push_targets (
                        target_id TEXT PRIMARY KEY NOT NULL,
                        user_id TEXT NOT NULL,
                        kind INTEGER NOT NULL CHECK (kind IN (1, 2, 3)), -- 1 APNs, 2 FCM, 3 Web Push
                        token_key TEXT NOT NULL UNIQUE,
                        apns_device_token TEXT,            -- lower-case hex
                        apns_topic TEXT,                   -- bundle id (apns-topic)
                        apns_environment INTEGER,          -- social.v1.ApnsEnvironment
                        fcm_registration_token TEXT,
                        web_push_endpoint TEXT,            -- https URL, scheme and host lower-cased
                        web_push_p256dh TEXT,              -- unpadded base64url, 65-byte P-256 point
                        web_push_auth TEXT,                -- unpadded base64url, 16 bytes
                        label TEXT NOT NULL DEFAULT '',
                        created_at INTEGER NOT NULL,
                        updated_at INTEGER NOT NULL        -- last (re-)registration: the limit's order
                    );
                    CREATE INDEX push_targets_user ON push_targets(user_id, updated_at, target_id);
                    """),
            Migration(
                name: "social.004-push-delivery",
                sql: """
                    -- Pushes waiting to leave (issue 36): one row per (notification, target), written in
                    -- the notification's transaction (PushQueue.enqueue) and deleted when the provider
                    -- accepted it, refused it for good, or it went stale (PushDelivery). due_at is the
                    -- next attempt: the device's backoff, a Retry-After, or the end of quiet hours.
                    -- AUTOINCREMENT: an id is never reused, so an answer that comes back after its row
                    -- was removed (the target went away) cannot touch a newer row.
                    CREATE TABLE push_outbox (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        notification_id TEXT NOT NULL,
                        target_id TEXT NOT NULL,
                        user_id TEXT NOT NULL,
                        provider INTEGER NOT NULL,         -- push_targets.kind
                        kind INTEGER NOT NULL,             -- social.v1.NotificationKind
                        created_at INTEGER NOT NULL,
                        due_at INTEGER NOT NULL,
                        expires_at INTEGER NOT NULL,       -- dropped unsent after this
                        attempts INTEGER NOT NULL DEFAULT 0,
                        last_error TEXT,
                        UNIQUE (notification_id, target_id)
                    );
                    CREATE INDEX push_outbox_due ON push_outbox(provider, due_at);
                    CREATE INDEX push_outbox_target ON push_outbox(target_id);
                    -- A target removed (by its user, moved to another user, evicted, gone at the
                    -- provider, erased) takes its waiting pushes with it.
                    CREATE TRIGGER push_targets_removed AFTER DELETE ON push_targets BEGIN
                        DELETE FROM push_outbox WHERE target_id = old.target_id;
                    END;
                    -- Push preferences (SetPushPreferences) beside mute and snooze.
                    ALTER TABLE notification_settings ADD COLUMN push_disabled_kinds TEXT NOT NULL DEFAULT '';
                    ALTER TABLE notification_settings ADD COLUMN quiet_start INTEGER;   -- minutes after local midnight
                    ALTER TABLE notification_settings ADD COLUMN quiet_end INTEGER;
                    ALTER TABLE notification_settings ADD COLUMN quiet_zone TEXT;       -- IANA name
                    """),
        ]
}

extension SocialSchema: ServiceDatabase {
    /// social's database as a whole: what the core opens and what `social-service backup` and
    /// `restore` work on.
    public static let schema = DatabaseSchema(service: "social", fileName: fileName, migrations: migrations)
}
