import Configuration
import Foundation

/// Where every setting of a process comes from, read through swift-configuration: the
/// command-line flags a process declares first, then environment variables. A setting is named by
/// a dotted key whose environment variable is the key upper-cased with dots as underscores
/// (`accounts.scrypt.n` ↔ `ACCOUNTS_SCRYPT_N`, `gateway.max.request.bytes` ↔
/// `GATEWAY_MAX_REQUEST_BYTES`).
///
/// Reading is strict where swift-configuration is lenient: its getters turn a value that does not
/// convert into "missing", so a typo (`ACCOUNTS_SCRYPT_N=32k`) would silently run with the
/// default. These getters throw `SettingsError` naming the variable and what it must be, and the
/// process refuses to start. An empty variable counts as unset.
public struct Settings: Sendable {
    let reader: ConfigReader

    /// - Parameters:
    ///   - environment: the variables to read (the process's by default; tests pass their own).
    ///   - flags: values of flags given on the command line, by key; they win over the environment.
    public init(environment: [String: String] = ProcessInfo.processInfo.environment, flags: [String: String] = [:]) {
        var values: [AbsoluteConfigKey: ConfigValue] = [:]
        for (key, value) in flags {
            values[AbsoluteConfigKey(key.split(separator: ".").map(String.init))] = ConfigValue(.string(value), isSecret: false)
        }
        reader = ConfigReader(providers: [
            InMemoryProvider(name: "flags", values: values),
            EnvironmentVariablesProvider(
                environmentVariables: environment.filter { !$0.value.isEmpty },
                secretsSpecifier: .dynamic { name, _ in name.hasSuffix("_TOKEN") || name.hasSuffix("_KEY") || name.hasSuffix("_SECRET") }),
        ])
    }

    /// The environment variable of `key`.
    public static func variable(_ key: String) -> String { key.uppercased().replacingOccurrences(of: ".", with: "_") }

    /// The raw text of `key`, nil when unset (or empty).
    public func string(_ key: String, secret: Bool = false) -> String? {
        guard let v = reader.string(forKey: ConfigKey(key.split(separator: ".").map(String.init)), isSecret: secret), !v.isEmpty else {
            return nil
        }
        return v
    }

    public func string(_ key: String, default value: String) -> String { string(key) ?? value }

    /// An integer, nil when unset; throws when it is not one or outside `range`.
    public func int(_ key: String, range: ClosedRange<Int>? = nil) throws -> Int? {
        guard let text = string(key) else { return nil }
        guard let n = Int(text.trimmingCharacters(in: .whitespaces)) else { throw SettingsError(key, "must be an integer, got '\(text)'") }
        if let range, !range.contains(n) { throw SettingsError(key, "must be in \(range.lowerBound)...\(range.upperBound), got \(n)") }
        return n
    }

    public func int(_ key: String, default value: Int, range: ClosedRange<Int>? = nil) throws -> Int {
        try int(key, range: range) ?? value
    }

    /// A number, nil when unset; throws when it is not one or negative.
    public func double(_ key: String) throws -> Double? {
        guard let text = string(key) else { return nil }
        guard let n = Double(text.trimmingCharacters(in: .whitespaces)), n.isFinite, n >= 0 else {
            throw SettingsError(key, "must be a non-negative number, got '\(text)'")
        }
        return n
    }

    /// A duration given in milliseconds (variables ending in `_MS`), nil when unset.
    public func milliseconds(_ key: String, range: ClosedRange<Int>? = nil) throws -> Duration? {
        try int(key, range: range).map { .milliseconds($0) }
    }

    public func milliseconds(_ key: String, default value: Duration, range: ClosedRange<Int>? = nil) throws -> Duration {
        try milliseconds(key, range: range) ?? value
    }

    /// A duration given in seconds, nil when unset.
    public func seconds(_ key: String, range: ClosedRange<Int>? = nil) throws -> Duration? {
        try int(key, range: range).map { .seconds($0) }
    }

    /// `on`/`1`/`true`/`yes` or `off`/`0`/`false`/`no` (any case, spaces around ignored);
    /// anything else throws naming the variable.
    public func bool(_ key: String, default value: Bool = false) throws -> Bool {
        guard let text = string(key) else { return value }
        switch text.trimmingCharacters(in: .whitespaces).lowercased() {
        case "on", "1", "true", "yes": return true
        case "off", "0", "false", "no": return false
        default: throw SettingsError(key, "must be on or off, got '\(text)'")
        }
    }

    /// One of a fixed set of values (compared lower-cased), nil when unset; throws naming them.
    public func choice<T: RawRepresentable & CaseIterable>(_ key: String) throws -> T? where T.RawValue == String {
        guard let text = string(key) else { return nil }
        guard let value = T(rawValue: text.trimmingCharacters(in: .whitespaces).lowercased()) else {
            throw SettingsError(key, "must be one of \(T.allCases.map(\.rawValue).joined(separator: ", ")), got '\(text)'")
        }
        return value
    }

    /// A comma-separated list (items trimmed, empty ones dropped), nil when unset.
    public func list(_ key: String) -> [String]? {
        string(key).map { $0.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty } }
    }
}

/// A setting the process cannot start with.
public struct SettingsError: Error, CustomStringConvertible, Sendable {
    public let description: String
    public init(_ key: String, _ problem: String) { description = "\(Settings.variable(key)) \(problem)" }
    public init(_ message: String) { description = message }
}
