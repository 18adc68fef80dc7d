@testable import Finance
import Testing

@Suite("Finance rules")
struct RulesTests {
    @Test func placeholder() { #expect(MoneyRules.isCurrencyCode("EUR")) }
}
