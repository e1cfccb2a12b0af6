// audit_credential_mask (credentials in the values the audit store keeps): each form a
// credential takes is masked with "***", names are split into words whichever way they are
// written, and what only looks like a credential is kept.
#include <machina/audit.hpp>

#include <doctest/doctest.h>

#include <string>
#include <string_view>

using namespace machina;

namespace {
std::string masked(std::string_view text) {
  return AuditCredentialMask().masked(text);
}
}  // namespace

TEST_CASE("credential names in any spelling: kebab, snake, camel and upper case") {
  CHECK(masked("--api-key=a") == "--api-key=***");
  CHECK(masked("apiKey=a") == "apiKey=***");
  CHECK(masked("API_KEY=a") == "API_KEY=***");
  CHECK(masked("privateKey=a") == "privateKey=***");
  CHECK(masked("DB_PASSWD=a") == "DB_PASSWD=***");
  CHECK(masked("--passphrase x") == "--passphrase ***");
  CHECK(masked("--client-secret x") == "--client-secret ***");
  CHECK(masked("--encryption-key x") == "--encryption-key ***");
  CHECK(masked("--credentials x") == "--credentials ***");
}

TEST_CASE("`key` alone is a credential only when assigned") {
  CHECK(masked("key=abc") == "key=***");
  CHECK(masked("--key abc") == "--key abc");
  CHECK(masked("--monkey=abc") == "--monkey=abc");
  CHECK(masked("--key-file=/k") == "--key-file=/k");
}

TEST_CASE("assignments: each credential value up to the next separator, an empty one kept") {
  CHECK(masked("a=1,token=x,b=2") == "a=1,token=***,b=2");
  CHECK(masked("token=") == "token=");
  CHECK(masked("password=a=b&x=1") == "password=***&x=1");
}

TEST_CASE("URLs: every password in the text, users without one kept") {
  CHECK(masked("from ftp://u:p1@a/x to https://v:p2@b") == "from ftp://u:***@a/x to https://v:***@b");
  CHECK(masked("'https://u:p@h'") == "'https://u:***@h'");
  CHECK(masked("https://u:@h/x") == "https://u:@h/x");
  CHECK(masked("https://h/a@b:c") == "https://h/a@b:c");  // '@' in the path, not user info
}

TEST_CASE("headers and schemes") {
  CHECK(masked("Proxy-Authorization: Basic abc") == "Proxy-Authorization: Basic ***");
  CHECK(masked("Authorization: raw") == "Authorization: ***");
  CHECK(masked("X-Auth-Token: t") == "X-Auth-Token: ***");
  CHECK(masked("Content-Type: json") == "Content-Type: json");
  CHECK(masked("echo bearer abc") == "echo bearer ***");
  // A flag where a value is expected is not taken as one.
  CHECK(masked("Authorization: -v") == "Authorization: -v");
}

TEST_CASE("-u name:password, --user and --proxy-user") {
  CHECK(masked("curl -u bob:pw x") == "curl -u bob:*** x");
  CHECK(masked("curl --user bob:pw x") == "curl --user bob:*** x");
  CHECK(masked("curl --proxy-user p:q x") == "curl --proxy-user p:*** x");
  CHECK(masked("curl -u bob x") == "curl -u bob x");
  CHECK(masked("curl -u bob: x") == "curl -u bob: x");
}

TEST_CASE("-pSECRET only for a mysql client, named by path or not") {
  CHECK(masked("/usr/bin/mysqldump -psecret db") == "/usr/bin/mysqldump -p*** db");
  CHECK(masked("mariadb -psecret") == "mariadb -p***");
  CHECK(masked("mysql -p --port=3306") == "mysql -p --port=3306");
  CHECK(masked("mysql --password-file x") == "mysql --password-file ***");
  CHECK(masked("psql -psecret") == "psql -psecret");
}

TEST_CASE("quotes and brackets around a word are kept, the word inside masked") {
  CHECK(masked("(\"--token\" \"t\");") == "(\"--token\" \"***\");");
  CHECK(masked("`password=x`,") == "`password=***`,");
  CHECK(masked("") == "");
  CHECK(masked("  \t ") == "  \t ");
}

TEST_CASE("one mask carries a flag's value into the next text until reset") {
  AuditCredentialMask mask;
  CHECK(mask.masked("mysql") == "mysql");
  CHECK(mask.masked("-psecret") == "-p***");
  mask.reset();
  CHECK(mask.masked("-psecret") == "-psecret");  // the program is -psecret, not mysql
  mask.reset();
  CHECK(mask.masked("curl -u") == "curl -u");
  CHECK(mask.masked("bob:pw") == "bob:***");
  CHECK(mask.masked("--token") == "--token");
  mask.reset();
  CHECK(mask.masked("t") == "t");
}
