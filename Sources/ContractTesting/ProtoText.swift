import Foundation

/// protoc's canonical text output (`protoc --decode`) as a tree, so two messages can be compared
/// field by field with some paths left out.
public struct TextNode: Sendable, Equatable {
    /// Field name (`user`), unknown field number (`5`) or `[extension]`.
    public var name: String
    /// The scalar as protoc prints it (`"alice"`, `42`, `IMAGE_FORMAT_PNG`); nil for a message.
    public var value: String?
    public var children: [TextNode]

    public init(name: String, value: String?, children: [TextNode]) {
        self.name = name
        self.value = value
        self.children = children
    }
}

public enum ProtoText {
    /// Parses protoc's output: `name: value` lines, `name {` … `}` blocks, one field per line.
    public static func parse(_ text: String) throws -> [TextNode] {
        var stack: [TextNode] = [TextNode(name: "", value: nil, children: [])]
        for (n, raw) in text.split(separator: "\n").enumerated() {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") { continue }
            if line == "}" {
                guard stack.count > 1 else { throw ContractError("line \(n + 1): unbalanced `}`") }
                let done = stack.removeLast()
                stack[stack.count - 1].children.append(done)
                continue
            }
            // The name runs to the first ':' or ' ' (a bracketed name to its ']').
            let nameEnd: String.Index
            if line.hasPrefix("["), let close = line.firstIndex(of: "]") {
                nameEnd = line.index(after: close)
            } else {
                nameEnd = line.firstIndex { $0 == ":" || $0 == " " } ?? line.endIndex
            }
            let name = String(line[..<nameEnd])
            let rest = line[nameEnd...]
            if rest == " {" || rest == ": {" || rest == "{" {
                stack.append(TextNode(name: name, value: nil, children: []))
            } else if rest.hasPrefix(": ") {
                stack[stack.count - 1].children.append(TextNode(name: name, value: String(rest.dropFirst(2)), children: []))
            } else {
                throw ContractError("line \(n + 1): cannot read `\(line)`")
            }
        }
        guard stack.count == 1 else { throw ContractError("unterminated `{` for \(stack.last!.name)") }
        return stack[0].children
    }

    /// Drops every node whose field path (names joined by `.`, no indices) is one of `paths` or
    /// lies below one: `notifications.created_at` removes it from every notification.
    public static func removing(_ paths: [String], from nodes: [TextNode]) -> [TextNode] {
        let set = Set(paths)
        func walk(_ nodes: [TextNode], _ prefix: String) -> [TextNode] {
            nodes.compactMap { node in
                let path = prefix.isEmpty ? node.name : prefix + "." + node.name
                if set.contains(path) { return nil }
                var copy = node
                copy.children = walk(node.children, path)
                return copy
            }
        }
        return walk(nodes, "")
    }

    /// One line per scalar (`user.contact_info.phone_number: "+44 …"`), with indices for
    /// repeated fields (`notifications[1].title`) and keys for maps (`data["k"]`), as the schema
    /// says; an empty message prints as `path {}` so its presence still counts. Map entries whose
    /// key was removed (a generated key, `users_by_id.key`) print as `users_by_id[*]` and are
    /// ordered by content: protoc sorts entries by key, and generated keys differ between runs.
    public static func flatten(_ nodes: [TextNode], message: String?, schema: ProtoSchema = .contracts) -> [String] {
        func walk(_ nodes: [TextNode], _ messageName: String?, _ prefix: String) -> [String] {
            let message = messageName.flatMap { schema.message($0) }
            var lines: [String] = []
            var seen: [String: Int] = [:]
            var keyless: [String: [[String]]] = [:]  // map field → entries' lines, emitted sorted
            var keylessOrder: [String] = []
            func emit(_ label: String, value: String?, children: [TextNode], childType: String?) -> [String] {
                let path = prefix.isEmpty ? label : prefix + "." + label
                if let value { return ["\(path): \(value)"] }
                if children.isEmpty { return ["\(path) {}"] }
                return walk(children, childType, path)
            }
            for node in nodes {
                let field = message?.field(node.name)
                if let entryName = field?.messageType, let entry = schema.message(entryName), entry.isMapEntry {
                    let valueNode = node.children.first { $0.name == "value" }
                    let valueType = entry.field("value")?.messageType
                    // An absent value is the default; show it as such rather than as a missing line.
                    let value = valueNode == nil ? "<default>" : valueNode?.value
                    if let key = node.children.first(where: { $0.name == "key" })?.value {
                        lines += emit("\(node.name)[\(key)]", value: value, children: valueNode?.children ?? [], childType: valueType)
                    } else if node.children.contains(where: { $0.name != "key" && $0.name != "value" }) {
                        lines += emit(node.name, value: nil, children: node.children, childType: entryName)
                    } else {
                        if keyless[node.name] == nil { keylessOrder.append(node.name) }
                        keyless[node.name, default: []].append(
                            emit("\(node.name)[*]", value: value, children: valueNode?.children ?? [], childType: valueType))
                    }
                    continue
                }
                var label = node.name
                if field?.isRepeated == true {
                    let i = seen[node.name, default: 0]
                    seen[node.name] = i + 1
                    label = "\(node.name)[\(i)]"
                }
                lines += emit(label, value: node.value, children: node.children, childType: field?.messageType)
            }
            for name in keylessOrder {
                lines += keyless[name]!.sorted { $0.lexicographicallyPrecedes($1) }.flatMap { $0 }
            }
            return lines
        }
        return walk(nodes, message, "")
    }

    /// The lines only in `expected` (`- `) and only in `actual` (`+ `), in order, from a longest
    /// common subsequence. Empty when equal.
    public static func diff(expected: [String], actual: [String]) -> [String] {
        let n = expected.count, m = actual.count
        var lcs = [[Int]](repeating: [Int](repeating: 0, count: m + 1), count: n + 1)
        for i in stride(from: n - 1, through: 0, by: -1) {
            for j in stride(from: m - 1, through: 0, by: -1) {
                lcs[i][j] = expected[i] == actual[j] ? lcs[i + 1][j + 1] + 1 : max(lcs[i + 1][j], lcs[i][j + 1])
            }
        }
        var out: [String] = []
        var i = 0, j = 0
        while i < n || j < m {
            if i < n, j < m, expected[i] == actual[j] {
                i += 1; j += 1
            } else if j == m || (i < n && lcs[i + 1][j] >= lcs[i][j + 1]) {
                out.append("- " + expected[i]); i += 1
            } else {
                out.append("+ " + actual[j]); j += 1
            }
        }
        return out
    }
}
