/// Accumulates indented source text.
struct Printer {
    private(set) var text = ""
    private var indent = ""

    mutating func line(_ s: String = "") {
        if s.isEmpty { text += "\n" } else { text += indent + s + "\n" }
    }

    mutating func lines(_ ss: [String]) { for s in ss { line(s) } }

    /// Prints `open`, the body one level deeper, then `close`.
    mutating func block(_ open: String, _ close: String = "}", _ body: (inout Printer) -> Void) {
        line(open)
        indent += "    "
        body(&self)
        indent.removeLast(4)
        line(close)
    }

    /// A `switch`: cases at the level of the `switch` keyword, as swift-format wants them.
    mutating func switchBlock(_ open: String, _ body: (inout Printer) -> Void) {
        line(open)
        body(&self)
        line("}")
    }

    /// A `///` doc comment from a `.proto` comment (blank lines inside kept as `///`).
    mutating func doc(_ comment: String?) {
        guard let comment else { return }
        var ls = comment.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        while let last = ls.last, last.trimmingSpaces.isEmpty { ls.removeLast() }
        while let first = ls.first, first.trimmingSpaces.isEmpty { ls.removeFirst() }
        for l in ls {
            let t = l.hasPrefix(" ") ? String(l.dropFirst()) : l
            line(t.trimmingSpaces.isEmpty ? "///" : "/// " + t.trailingSpacesTrimmed)
        }
    }
}

extension String {
    var trimmingSpaces: String {
        String(drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
    }
    var trailingSpacesTrimmed: String {
        String(reversed().drop { $0 == " " || $0 == "\t" }.reversed())
    }
    /// A Swift string literal for `self`.
    var swiftLiteral: String {
        var out = "\""
        for u in unicodeScalars {
            switch u {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            default:
                if u.value < 0x20 || u.value == 0x7f { out += "\\u{\(String(u.value, radix: 16))}" } else { out.unicodeScalars.append(u) }
            }
        }
        return out + "\""
    }
}
