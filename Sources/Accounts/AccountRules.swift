import Contracts
import ServiceKit

/// The field rules of the contract (accounts.proto comments), in one place so SignUp, UpgradeGuest
/// and UpdateProfile apply exactly the same ones. Each check adds to a `FieldErrors` and returns the
/// normalised value (trimmed), so a request is rejected once, naming every bad field.
enum AccountRules {
    static let usernameLength = 3...32
    static let passwordLength = 8...128
    static let displayNameMax = 64
    static let phoneMax = 32
    static let guestPrefix = "guest-"

    // The generic rules (trimming, lengths, control characters, emails, page sizes) are the kit's.
    static func trimmed(_ s: String) -> String { FieldRules.trimmed(s) }
    static func length(_ s: String) -> Int { FieldRules.length(s) }
    static func key(_ s: String) -> String { FieldRules.key(s) }
    static func hasControlCharacters(_ s: String) -> Bool { FieldRules.hasControlCharacters(s) }

    // MARK: Fields

    static func username(_ raw: String, field: String = "username", into errors: inout FieldErrors) -> String {
        let v = trimmed(raw)
        if v.isEmpty {
            errors.add(field, "required")
        } else if !usernameLength.contains(length(v)) {
            errors.add(field, "must be 3 to 32 characters")
        } else if !v.unicodeScalars.allSatisfy(isUsernameScalar) {
            errors.add(field, "may only contain letters A-Z, digits, '_', '.' and '-'")
        } else if key(v).hasPrefix(guestPrefix) {
            errors.add(field, "must not start with \"guest-\" (reserved for guest accounts)")
        }
        return v
    }

    static func isUsernameScalar(_ c: Unicode.Scalar) -> Bool {
        switch c {
        case "a"..."z", "A"..."Z", "0"..."9", "_", ".", "-": true
        default: false
        }
    }

    static func email(_ raw: String, field: String = "email", required: Bool = true, into errors: inout FieldErrors) -> String {
        FieldRules.email(raw, field: field, required: required, into: &errors)
    }

    /// Passwords are not trimmed: every character is part of the secret.
    static func newPassword(_ v: String, field: String = "password", into errors: inout FieldErrors) {
        if v.isEmpty {
            errors.add(field, "required")
        } else if !passwordLength.contains(length(v)) {
            errors.add(field, "must be 8 to 128 characters")
        }
    }

    static func displayName(_ raw: String, field: String = "display_name", into errors: inout FieldErrors) -> String {
        let v = trimmed(raw)
        if length(v) > displayNameMax {
            errors.add(field, "must be at most 64 characters")
        } else if hasControlCharacters(v) {
            errors.add(field, "must not contain control characters")
        }
        return v
    }

    static func contactInfo(_ raw: Accounts_V1_ContactInfo, field: String = "contact_info", into errors: inout FieldErrors) -> Accounts_V1_ContactInfo
    {
        var out = Accounts_V1_ContactInfo()
        let phone = trimmed(raw.phoneNumber)
        if length(phone) > phoneMax {
            errors.add("\(field).phone_number", "must be at most 32 characters")
        } else if !phone.unicodeScalars.allSatisfy(isPhoneScalar) {
            errors.add("\(field).phone_number", "may only contain digits, spaces and \"+-()\"")
        }
        out.phoneNumber = phone
        out.publicEmail = email(raw.publicEmail, field: "\(field).public_email", required: false, into: &errors)
        return out
    }

    static func isPhoneScalar(_ c: Unicode.Scalar) -> Bool {
        switch c {
        case "0"..."9", " ", "+", "-", "(", ")": true
        default: false
        }
    }

    /// Page size rule of every list: negative rejected, 0 = default, clamped to 100.
    static func pageSize(_ requested: Int32, field: String = "page_size", defaultSize: Int = 20, into errors: inout FieldErrors) -> Int {
        FieldRules.pageSize(requested, field: field, defaultSize: defaultSize, into: &errors)
    }
}
