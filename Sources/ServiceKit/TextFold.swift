import Foundation

/// The one rule of every case-insensitive text match the services offer (habit history's
/// `comment_contains`, the marketplace's keywords): the stored text and the client's words are
/// folded alike, and a word matches when its folded form is a substring (of Unicode scalars) of
/// the folded text. SQLite's `LIKE`, `lower()` and `NOCASE` fold ASCII only, so the folded text is
/// stored beside the text and compared exactly (`instr`, FTS5 trigrams with `case_sensitive 1`).
///
/// `fold(s)` = NFKC(case fold(NFKC(s))):
/// - NFKC: composed and decomposed accents are one (é as U+00E9 = e + U+0301), and compatibility
///   forms are their plain letters (full-width "Ｔｅｓｔ" = "test", the ligature "ﬁ" = "fi").
/// - Full case folding, locale-independent: Unicode CaseFolding.txt's statuses C and F without the
///   Turkic T mappings (what ICU's default folding and Python's `str.casefold()` do): "ß", "ẞ" and
///   "SS" fold to "ss"; the Greek final sigma "ς", "σ" and "Σ" to "σ"; "I" to "i"; the Turkish
///   dotted capital "İ" to "i" + U+0307 (combining dot above), which matches "İ" and "i̇" but not a
///   plain "i" followed by the next letter ("istanbul" does not find "İstanbul", "stanbul" does);
///   the dotless "ı" stays "ı" (it matches "ı" only, not "I").
/// - Accents and other marks are kept: "é" ≠ "e", "ό" ≠ "ο", "ü" ≠ "u".
public enum TextFold {
    /// The folded form of `text` (stored beside the text, and of every word looked for).
    public static func fold(_ text: String) -> String {
        // ASCII (most text): NFKC changes nothing and case folding is A-Z → a-z.
        if text.utf8.allSatisfy({ $0 < 0x80 }) {
            guard text.utf8.contains(where: { (0x41...0x5A).contains($0) }) else { return text }
            return String(decoding: text.utf8.map { (0x41...0x5A).contains($0) ? $0 | 0x20 : $0 }, as: UTF8.self)
        }
        return text.precomposedStringWithCompatibilityMapping.folding(options: [.caseInsensitive], locale: nil)
            .precomposedStringWithCompatibilityMapping
    }

    /// Whether the folded `word` occurs in the folded `text`: a substring of Unicode scalars (as
    /// SQLite's `instr` and FTS5's trigrams compare), not of characters — a word may match part of
    /// a character ("i" in "i̇").
    public static func contains(_ text: String, _ word: String) -> Bool {
        word.isEmpty || Array(text.utf8).firstRange(of: Array(word.utf8)) != nil
    }
}
