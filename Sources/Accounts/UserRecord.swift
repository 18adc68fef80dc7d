import Contracts
import ServiceKit
import Storage

/// One row of `users`, as the handlers use it.
struct UserRecord: Sendable {
    var id: String
    var username: String
    var email: String
    var passwordHash: String?
    var displayName: String
    var contact: Accounts_V1_ContactInfo?
    var guest: Bool
    var avatarBuiltin: String?
    var avatarFormat: Accounts_V1_ImageFormat?
    var avatarSize: Int32
    var avatarUploadedAt: Int64?
    var createdAt: Int64
    var updatedAt: Int64
    var deletedAt: Int64?

    static let columns = """
        id, username, email, password_hash, display_name, phone_number, public_email, has_contact, guest,
        avatar_builtin, avatar_format, avatar_size, avatar_uploaded_at, created_at, updated_at, deleted_at
        """

    init(row: Row) throws {
        id = try row.get("id")
        username = try row.get("username", as: String?.self) ?? ""
        email = try row.get("email", as: String?.self) ?? ""
        passwordHash = try row.get("password_hash")
        displayName = try row.get("display_name")
        if try row.get("has_contact", as: Bool.self) {
            var c = Accounts_V1_ContactInfo()
            c.phoneNumber = try row.get("phone_number")
            c.publicEmail = try row.get("public_email")
            contact = c
        }
        guest = try row.get("guest")
        avatarBuiltin = try row.get("avatar_builtin")
        avatarFormat = try row.get("avatar_format", as: Int32?.self).map(Accounts_V1_ImageFormat.init(rawValue:))
        avatarSize = Int32(try row.get("avatar_size", as: Int64?.self) ?? 0)
        avatarUploadedAt = try row.get("avatar_uploaded_at")
        createdAt = try row.get("created_at")
        updatedAt = try row.get("updated_at")
        deletedAt = try row.get("deleted_at")
    }

    var isDeleted: Bool { deletedAt != nil }

    var avatar: Accounts_V1_Avatar? {
        if let b = avatarBuiltin {
            var a = Accounts_V1_Avatar()
            a.builtinAvatarId = b
            return a
        }
        if let format = avatarFormat, let at = avatarUploadedAt {
            var info = Accounts_V1_AvatarImageInfo()
            info.format = format
            info.sizeBytes = avatarSize
            info.uploadedAt = Google_Protobuf_Timestamp(milliseconds: at)
            var a = Accounts_V1_Avatar()
            a.uploaded = info
            return a
        }
        return nil
    }

    /// The private view (the caller's own account).
    var proto: Accounts_V1_User {
        var u = Accounts_V1_User()
        u.userId = id
        u.username = username
        u.email = email
        u.displayName = displayName
        if let contact { u.contactInfo = contact }
        if let avatar { u.avatar = avatar }
        u.guest = guest
        u.createdAt = Google_Protobuf_Timestamp(milliseconds: createdAt)
        u.updatedAt = Google_Protobuf_Timestamp(milliseconds: updatedAt)
        return u
    }

    /// What other users see: no email.
    var publicProfile: Accounts_V1_PublicProfile {
        var p = Accounts_V1_PublicProfile()
        p.userId = id
        p.username = username
        p.displayName = displayName
        if let contact { p.contactInfo = contact }
        if let avatar { p.avatar = avatar }
        p.guest = guest
        p.createdAt = Google_Protobuf_Timestamp(milliseconds: createdAt)
        return p
    }

    var reference: Common_V1_UserRef {
        var r = Common_V1_UserRef()
        r.userId = id
        r.username = username
        r.displayName = displayName
        return r
    }
}

/// Lookups of live (not deleted) users.
enum UserQueries {
    static func byID(_ db: some SQLReader, _ id: String) throws -> UserRecord? {
        try db.queryOne("SELECT \(UserRecord.columns) FROM users WHERE id = ? AND deleted_at IS NULL", arguments: [.text(id)])
            .map(UserRecord.init(row:))
    }

    static func byUsername(_ db: some SQLReader, _ username: String) throws -> UserRecord? {
        try db.queryOne(
            "SELECT \(UserRecord.columns) FROM users WHERE username_key = ? AND deleted_at IS NULL", arguments: [.text(AccountRules.key(username))]
        )
        .map(UserRecord.init(row:))
    }

    static func byEmail(_ db: some SQLReader, _ email: String) throws -> UserRecord? {
        try db.queryOne(
            "SELECT \(UserRecord.columns) FROM users WHERE email_key = ? AND deleted_at IS NULL", arguments: [.text(AccountRules.key(email))]
        )
        .map(UserRecord.init(row:))
    }

    /// Which of the fields name an existing account (for ALREADY_EXISTS naming each).
    static func taken(_ db: some SQLReader, username: String?, email: String?, except userID: String? = nil) throws -> [String] {
        var fields: [String] = []
        if let username, let row = try db.queryOne("SELECT id FROM users WHERE username_key = ?", arguments: [.text(AccountRules.key(username))]),
            try row.get(0, as: String.self) != userID
        {
            fields.append("username")
        }
        if let email, let row = try db.queryOne("SELECT id FROM users WHERE email_key = ?", arguments: [.text(AccountRules.key(email))]),
            try row.get(0, as: String.self) != userID
        {
            fields.append("email")
        }
        return fields
    }
}
