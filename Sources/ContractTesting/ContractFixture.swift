import Foundation

/// One fixture file, `Tests/Fixtures/<service>/<Method>.<request|response>.txtpb`: a message in
/// protobuf text format, headed by `# proto-message: <full.Name>` and, for responses,
/// `# generated: <path>, <path>` (the fields a live service generates; see Proto/README.md).
public struct ContractFixture: Sendable, CustomStringConvertible {
    public enum Role: String, Sendable { case request, response }

    /// Service directory (`accounts`).
    public let service: String
    /// File name (`SignUp.request.txtpb`).
    public let fileName: String
    public let method: String
    public let role: Role
    /// Full protobuf name from `# proto-message:`.
    public let messageName: String
    /// Paths from `# generated:` (empty for requests and for responses that list none).
    public let generatedPaths: [String]
    /// Whether the file has a `# generated:` line at all (every response fixture must).
    public let hasGeneratedLine: Bool
    /// The whole file, comments included (protoc skips `#` lines).
    public let text: String

    public var description: String { "\(service)/\(fileName)" }

    public init(service: String, fileName: String, text: String) throws {
        self.service = service
        self.fileName = fileName
        self.text = text
        let parts = fileName.split(separator: ".")
        guard parts.count == 3, parts[2] == "txtpb", let role = Role(rawValue: String(parts[1])) else {
            throw ContractError("\(service)/\(fileName): expected <Method>.request.txtpb or <Method>.response.txtpb")
        }
        self.method = String(parts[0])
        self.role = role

        var messageName: String?
        var generated: [String]?
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            let l = line.trimmingCharacters(in: .whitespaces)
            guard l.hasPrefix("#") else { continue }
            let comment = l.dropFirst().trimmingCharacters(in: .whitespaces)
            if comment.hasPrefix("proto-message:"), messageName == nil {
                messageName = comment.dropFirst("proto-message:".count).trimmingCharacters(in: .whitespaces)
            } else if comment.hasPrefix("generated:"), generated == nil {
                generated = comment.dropFirst("generated:".count).split(separator: ",")
                    .map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            }
        }
        let first = text.split(separator: "\n").first.map(String.init) ?? ""
        guard let name = messageName, !name.isEmpty, first.hasPrefix("# proto-message:") else {
            throw ContractError("\(service)/\(fileName): the first line must be `# proto-message: <full.Name>`")
        }
        self.messageName = name
        self.generatedPaths = generated ?? []
        self.hasGeneratedLine = generated != nil
    }

    /// Reads `Tests/Fixtures/<service>/<fileName>`.
    public static func load(service: String, fileName: String, paths: ContractPaths = .locate()) throws -> ContractFixture {
        let path = paths.fixturesDirectory + "/" + service + "/" + fileName
        guard let data = FileManager.default.contents(atPath: path) else { throw ContractError("cannot read \(path)") }
        return try ContractFixture(service: service, fileName: fileName, text: String(decoding: data, as: UTF8.self))
    }

    /// Every fixture of a service directory, sorted by file name.
    public static func all(service: String, paths: ContractPaths = .locate()) throws -> [ContractFixture] {
        try paths.fixtureNames(service: service).map { try load(service: service, fileName: $0, paths: paths) }
    }
}
