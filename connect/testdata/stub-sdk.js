/*
 * Stub of Meta's JavaScript SDK (connect.facebook.net/en_US/sdk.js) for the
 * browser tests of the connect page. It plays Embedded Signup without a
 * network: FB.login checks its options, records them, posts a
 * WA_EMBEDDED_SIGNUP message to the page and calls the login callback.
 *
 * Configuration, later sources win:
 *   1. defaults below;
 *   2. the query string of this script's URL, e.g.
 *      stub-sdk.js?pnid=1001&waba=2001&code=abc&event=FINISH;
 *   3. window.__stubConfig = {pnid, waba, code, ...}, read when FB.login runs.
 *
 * Keys:
 *   pnid, waba, business   ids sent with FINISH
 *   code                   authorization code handed to the login callback
 *   event                  FINISH (default), FINISH_ONLY_WABA, CANCEL,
 *                          CANCEL_ERROR (CANCEL carrying error_message),
 *                          ERROR, or NONE (no message at all)
 *   step                   current_step sent with CANCEL (PHONE_NUMBER_SETUP)
 *   error_message, error_code   sent with ERROR and CANCEL_ERROR
 *   order                  message-first (default) or callback-first
 *   no_code                "1"/true: the callback gets no code even on FINISH
 *   delay                  milliseconds before the first of the two (50)
 *   gap                    milliseconds between the two (50)
 *
 * What it records for the test: window.__fbInitOpts, window.__fbLoginOpts,
 * window.__fbLoginCalls, window.__stubErrors (option problems; each one is
 * also written with console.error, so a test that fails on console errors
 * catches it).
 */
(function () {
  'use strict';

  var scriptSrc = (document.currentScript && document.currentScript.src) || '';

  var defaults = {
    pnid: '106540352242922',
    waba: '524126980791429',
    business: '2729063490586005',
    code: 'stub-code-0001',
    event: 'FINISH',
    step: 'PHONE_NUMBER_SETUP',
    error_message: 'Something went wrong in the stub signup',
    error_code: '524',
    order: 'message-first',
    no_code: false,
    delay: 50,
    gap: 50
  };

  function queryConfig() {
    var out = {};
    try {
      var u = new URL(scriptSrc, window.location.href);
      u.searchParams.forEach(function (v, k) {
        out[k] = v;
      });
    } catch (e) {
      // no usable script URL: defaults only
    }
    return out;
  }

  function config() {
    var c = {};
    var k;
    var q = queryConfig();
    var w = window.__stubConfig || {};
    for (k in defaults) c[k] = defaults[k];
    for (k in q) c[k] = q[k];
    for (k in w) c[k] = w[k];
    c.no_code = c.no_code === true || c.no_code === '1' || c.no_code === 'true';
    c.delay = Number(c.delay) || 0;
    c.gap = Number(c.gap) || 0;
    return c;
  }

  function problem(msg) {
    (window.__stubErrors = window.__stubErrors || []).push(msg);
    console.error('stub-sdk: ' + msg);
  }

  function post(payload) {
    window.postMessage(JSON.stringify(payload), '*');
  }

  window.__fbLoginCalls = 0;
  window.__stubErrors = window.__stubErrors || [];

  var initialised = false;

  window.FB = {
    init: function (opts) {
      window.__fbInitOpts = opts;
      initialised = true;
      if (!opts || !opts.appId) problem('FB.init without appId');
      if (!opts || !/^v\d+\.\d+$/.test(String(opts.version || ''))) problem('FB.init version should look like v26.0, got ' + (opts && opts.version));
    },

    login: function (cb, opts) {
      window.__fbLoginCalls++;
      window.__fbLoginOpts = opts;
      var valid = true;
      function check(ok, msg) {
        if (!ok) {
          valid = false;
          problem(msg);
        }
      }
      check(initialised, 'FB.login before FB.init');
      check(typeof cb === 'function', 'FB.login without a callback');
      check(!!opts && typeof opts === 'object', 'FB.login without options');
      opts = opts || {};
      check(typeof opts.config_id === 'string' && opts.config_id !== '', 'config_id missing');
      check(opts.response_type === 'code', "response_type should be 'code', got " + opts.response_type);
      check(opts.override_default_response_type === true, 'override_default_response_type should be true');
      check(!!opts.extras && typeof opts.extras === 'object' && !!opts.extras.setup && typeof opts.extras.setup === 'object', 'extras.setup should be an object');
      if (typeof cb !== 'function') return;

      var c = config();
      var message = null;
      switch (c.event) {
        case 'FINISH':
        case 'FINISH_WHATSAPP_BUSINESS_APP_ONBOARDING':
          message = { type: 'WA_EMBEDDED_SIGNUP', event: c.event, data: { phone_number_id: String(c.pnid), waba_id: String(c.waba), business_id: String(c.business) } };
          break;
        case 'FINISH_ONLY_WABA':
          message = { type: 'WA_EMBEDDED_SIGNUP', event: c.event, data: { waba_id: String(c.waba), business_id: String(c.business) } };
          break;
        case 'CANCEL':
          message = { type: 'WA_EMBEDDED_SIGNUP', event: 'CANCEL', data: { current_step: String(c.step) } };
          break;
        case 'CANCEL_ERROR':
          message = { type: 'WA_EMBEDDED_SIGNUP', event: 'CANCEL', data: { error_message: String(c.error_message), error_code: String(c.error_code), session_id: 'stub-session', timestamp: String(Date.now()) } };
          break;
        case 'ERROR':
          message = { type: 'WA_EMBEDDED_SIGNUP', event: 'ERROR', data: { error_message: String(c.error_message), error_code: String(c.error_code), session_id: 'stub-session' } };
          break;
        case 'NONE':
          message = null;
          break;
        default:
          problem('unknown stub event ' + c.event);
      }
      var success = valid && String(c.event).indexOf('FINISH') === 0 && !c.no_code;
      var response = success
        ? { status: 'connected', authResponse: { code: String(c.code), userID: '', expiresIn: 0, signedRequest: '' } }
        : { status: 'unknown', authResponse: null };

      var first, second;
      function sendMessage() {
        if (message) post(message);
      }
      function callBack() {
        cb(response);
      }
      if (c.order === 'callback-first') {
        first = callBack;
        second = sendMessage;
      } else {
        first = sendMessage;
        second = callBack;
      }
      setTimeout(function () {
        first();
        setTimeout(second, c.gap);
      }, c.delay);
    },

    getLoginStatus: function (cb) {
      if (typeof cb === 'function') cb({ status: 'unknown', authResponse: null });
    },

    AppEvents: { logEvent: function () {}, logPageView: function () {} },
    XFBML: { parse: function () {} }
  };

  // Like the real SDK: call fbAsyncInit once the SDK is defined.
  if (typeof window.fbAsyncInit === 'function') {
    setTimeout(function () {
      if (typeof window.fbAsyncInit === 'function') window.fbAsyncInit();
    }, 0);
  }
})();
