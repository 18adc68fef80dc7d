import Contracts
import GRPCContracts
import RPCCore
import ServiceKit
import Storage

// MARK: Push targets (issue 36: the devices and browsers that get pushes while the app is closed)

extension SocialService {
    public func registerPushTarget(
        request: Social_V1_RegisterPushTargetRequest, context: ServerContext
    ) async throws -> Social_V1_RegisterPushTargetResponse {
        let caller = try core.caller(context)
        if caller.isGuest {
            // A guest account is made without any credential, 100 per address per hour: no such
            // account may make the service send to a device or URL of its choosing.
            throw RPCError(.permissionDenied, "guest accounts cannot register push targets: upgrade the account (UpgradeGuest) first")
        }
        var errors = FieldErrors()
        let spec = PushTargetRules.spec(request.hasTarget ? request.target : nil, into: &errors)
        try errors.throwIfAny()
        guard let spec else { throw RPCError(.invalidArgument, "invalid request: target") }
        let now = core.now()
        let limit = core.configuration.maxPushTargetsPerUser
        let (target, evicted) = try await core.store.write { tx in
            try PushTargets.register(tx, user: caller.userID, spec, now: now, limit: limit)
        }
        var response = Social_V1_RegisterPushTargetResponse()
        response.target = target
        response.evictedTargetIds = evicted
        return response
    }

    public func listPushTargets(
        request: Social_V1_ListPushTargetsRequest, context: ServerContext
    ) async throws -> Social_V1_ListPushTargetsResponse {
        let caller = try core.caller(context)
        var response = Social_V1_ListPushTargetsResponse()
        response.targets = try await core.store.read { c in try PushTargets.list(c, user: caller.userID) }
        return response
    }

    public func removePushTarget(
        request: Social_V1_RemovePushTargetRequest, context: ServerContext
    ) async throws -> Social_V1_RemovePushTargetResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let targetID = FieldRules.id(request.targetId, field: "target_id", into: &errors)
        try errors.throwIfAny()
        try await core.store.write { tx in
            // Another user's target answers exactly like an unknown id: ids cannot be probed.
            try tx.execute("DELETE FROM push_targets WHERE target_id = ? AND user_id = ?", targetID, caller.userID)
            if tx.changes == 0 { throw FieldErrors.single(.notFound, field: "target_id", "no such push target of yours") }
        }
        return Social_V1_RemovePushTargetResponse()
    }
}

/// The `push_targets` table: registering (idempotent per token, moving a token between users,
/// the per-user limit) and reading targets back as the contract's `PushTarget`.
enum PushTargets {
    static let columns = """
        target_id, user_id, kind, apns_device_token, apns_topic, apns_environment, fcm_registration_token,
        web_push_endpoint, web_push_p256dh, web_push_auth, label, created_at, updated_at
        """

    /// One stored row, by column name.
    struct Record {
        var targetID: String
        var userID: String
        var kind: PushTargetSpec.Kind
        var apnsDeviceToken: String?
        var apnsTopic: String?
        var apnsEnvironment: Int32?
        var fcmRegistrationToken: String?
        var webPushEndpoint: String?
        var webPushP256dh: String?
        var webPushAuth: String?
        var label: String
        var createdAt: Int64
        var updatedAt: Int64

        init(row: Row) throws {
            targetID = try row.get("target_id")
            userID = try row.get("user_id")
            guard let kind = PushTargetSpec.Kind(rawValue: try row.get("kind")) else {
                throw RPCError(.internal, "push target \(targetID) has an unknown kind")
            }
            self.kind = kind
            apnsDeviceToken = try row.get("apns_device_token")
            apnsTopic = try row.get("apns_topic")
            apnsEnvironment = try row.get("apns_environment")
            fcmRegistrationToken = try row.get("fcm_registration_token")
            webPushEndpoint = try row.get("web_push_endpoint")
            webPushP256dh = try row.get("web_push_p256dh")
            webPushAuth = try row.get("web_push_auth")
            label = try row.get("label")
            createdAt = try row.get("created_at")
            updatedAt = try row.get("updated_at")
        }

        var target: Social_V1_PushTarget {
            var t = Social_V1_PushTarget()
            t.targetId = targetID
            switch kind {
            case .apns:
                var a = Social_V1_ApnsTarget()
                a.deviceToken = apnsDeviceToken ?? ""
                a.topic = apnsTopic ?? ""
                a.environment = Social_V1_ApnsEnvironment(rawValue: apnsEnvironment ?? 0)
                t.apns = a
            case .fcm:
                var f = Social_V1_FcmTarget()
                f.registrationToken = fcmRegistrationToken ?? ""
                t.fcm = f
            case .webPush:
                var w = Social_V1_WebPushTarget()
                w.endpoint = webPushEndpoint ?? ""
                w.p256dh = webPushP256dh ?? ""
                w.auth = webPushAuth ?? ""
                t.webPush = w
            }
            t.label = label
            t.createdAt = Google_Protobuf_Timestamp(milliseconds: createdAt)
            t.updatedAt = Google_Protobuf_Timestamp(milliseconds: updatedAt)
            return t
        }
    }

    /// The user's targets, most recently registered first (ties: the later id first).
    static func list(_ db: some SQLReader, user: String) throws -> [Social_V1_PushTarget] {
        try db.query("SELECT \(columns) FROM push_targets WHERE user_id = ? ORDER BY updated_at DESC, target_id DESC", user)
            .map { try Record(row: $0).target }
    }

    /// Registers `spec` for `user` in one transaction: the user's own registration of the same
    /// token is updated in place (same id, created_at kept); another user's is deleted and a new
    /// target made (the token moves); then the user's least recently registered targets past
    /// `limit` are deleted. Returns the target and the evicted ids.
    static func register(
        _ tx: Transaction, user: String, _ spec: PushTargetSpec, now: Int64, limit: Int
    ) throws -> (Social_V1_PushTarget, [String]) {
        // EraseUser may have committed since the token was checked: nothing is stored for an
        // erased account.
        if try tx.queryOne("SELECT 1 FROM erased_users WHERE id = ?", user) != nil {
            throw RPCError(.unauthenticated, "this account was deleted")
        }
        let existing = try tx.queryOne("SELECT \(columns) FROM push_targets WHERE token_key = ?", spec.tokenKey).map { try Record(row: $0) }
        let targetID: String
        if let existing, existing.userID == user {
            targetID = existing.targetID
            try tx.execute(
                """
                UPDATE push_targets SET apns_device_token = ?, apns_topic = ?, apns_environment = ?, fcm_registration_token = ?,
                    web_push_endpoint = ?, web_push_p256dh = ?, web_push_auth = ?, label = ?, updated_at = max(updated_at, ?)
                WHERE target_id = ?
                """, spec.apnsDeviceToken, spec.apnsTopic, spec.apnsEnvironment, spec.fcmRegistrationToken, spec.webPushEndpoint,
                spec.webPushP256dh, spec.webPushAuth, spec.label, now, targetID)
        } else {
            if let existing {
                // The device now belongs to whoever signed in on it last.
                try tx.execute("DELETE FROM push_targets WHERE target_id = ?", existing.targetID)
            }
            targetID = ULID.make(now: now)
            try tx.execute(
                """
                INSERT INTO push_targets (target_id, user_id, kind, token_key, apns_device_token, apns_topic, apns_environment,
                    fcm_registration_token, web_push_endpoint, web_push_p256dh, web_push_auth, label, created_at, updated_at)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """, targetID, user, spec.kind.rawValue, spec.tokenKey, spec.apnsDeviceToken, spec.apnsTopic, spec.apnsEnvironment,
                spec.fcmRegistrationToken, spec.webPushEndpoint, spec.webPushP256dh, spec.webPushAuth, spec.label, now, now)
        }
        var evicted: [String] = []
        let count = try tx.queryOne("SELECT count(*) FROM push_targets WHERE user_id = ?", user)!.get(0, as: Int64.self)
        if count > Int64(limit) {
            evicted = try tx.query(
                "SELECT target_id FROM push_targets WHERE user_id = ? AND target_id <> ? ORDER BY updated_at, target_id LIMIT ?",
                user, targetID, count - Int64(limit)
            ).map { try $0.get("target_id") }
            for id in evicted { try tx.execute("DELETE FROM push_targets WHERE target_id = ?", id) }
        }
        guard let row = try tx.queryOne("SELECT \(columns) FROM push_targets WHERE target_id = ?", targetID) else {
            throw RPCError(.internal, "the push target just stored is missing")
        }
        return (try Record(row: row).target, evicted)
    }
}
