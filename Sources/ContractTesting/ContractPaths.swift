import Foundation

/// Where the contracts live in a checkout: `Proto/` (the `.proto` files) and `Tests/Fixtures/`
/// (one request and one response fixture per RPC).
public struct ContractPaths: Sendable {
    /// The repository root (the directory holding `Proto/` and `Tests/Fixtures/`).
    public var root: String

    public init(root: String) { self.root = root }

    public var protoDirectory: String { root + "/Proto" }
    public var fixturesDirectory: String { root + "/Tests/Fixtures" }

    /// Finds the checkout: `$CONTRACT_ROOT`, else the working directory or one of its parents,
    /// else the parents of this source file (tests run from anywhere inside the package).
    public static func locate(file: String = #filePath) -> ContractPaths {
        if let root = ProcessInfo.processInfo.environment["CONTRACT_ROOT"], !root.isEmpty {
            return ContractPaths(root: root)
        }
        for start in [FileManager.default.currentDirectoryPath, (file as NSString).deletingLastPathComponent] {
            var dir = start
            while dir != "/" && !dir.isEmpty {
                if isCheckout(dir) { return ContractPaths(root: dir) }
                dir = (dir as NSString).deletingLastPathComponent
            }
        }
        return ContractPaths(root: FileManager.default.currentDirectoryPath)
    }

    private static func isCheckout(_ dir: String) -> Bool {
        var isDir: ObjCBool = false
        return FileManager.default.fileExists(atPath: dir + "/Proto", isDirectory: &isDir) && isDir.boolValue
            && FileManager.default.fileExists(atPath: dir + "/Tests/Fixtures", isDirectory: &isDir) && isDir.boolValue
    }

    /// Every `.proto` file of a service directory (`accounts` → `accounts/v1/accounts.proto`),
    /// relative to `Proto/`, sorted. Their imports are found through protoc's include paths.
    public func protoFiles(service: String) throws -> [String] {
        let base = protoDirectory + "/" + service
        guard let walker = FileManager.default.enumerator(atPath: base) else {
            throw ContractError("no directory \(base)")
        }
        var files: [String] = []
        while let rel = walker.nextObject() as? String {
            if rel.hasSuffix(".proto") { files.append(service + "/" + rel) }
        }
        guard !files.isEmpty else { throw ContractError("no .proto files under \(base)") }
        return files.sorted()
    }

    /// The fixture file names of a service directory (`SignUp.request.txtpb`, …), sorted.
    public func fixtureNames(service: String) throws -> [String] {
        let dir = fixturesDirectory + "/" + service
        return try FileManager.default.contentsOfDirectory(atPath: dir).filter { $0.hasSuffix(".txtpb") }.sorted()
    }
}

/// A failure of the contract tooling itself (missing file, malformed fixture, protoc error).
public struct ContractError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}
