// For tests: a GoogleTest fixture with one throwaway PKI (a CA and
// certificates made with the openssl command, tls/throwaway_pki.h) per test
// suite, at pki_.
#ifndef TENSORHUB_TLS_PKI_TEST_BASE_H_
#define TENSORHUB_TLS_PKI_TEST_BASE_H_

#include <gtest/gtest.h>

#include "tls/throwaway_pki.h"

namespace tensorhub::tls {

class PkiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto p = ThrowawayPki::Make();
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    pki_ = std::move(p).value().release();
  }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(pki_, nullptr); }

  static inline ThrowawayPki* pki_ = nullptr;
};

}  // namespace tensorhub::tls

#endif  // TENSORHUB_TLS_PKI_TEST_BASE_H_
